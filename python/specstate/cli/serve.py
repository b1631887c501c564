"""``specstate serve``: the OpenAI-compatible HTTP server (:mod:`specstate.serve`; needs the server extra).

Its options are made from the fields of :class:`~specstate.serve.ServerConfig` and
:class:`~specstate.serve.RequestLimits` (each field's help, name, unit and range written once, beside it), as
llama-cpp-python's server builds its command line from its settings model; ``--host`` and ``--port`` say where
to listen."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any, get_args

from specstate._typing import DraftPolicy, Mode
from specstate.cli._args import N_CTX, Range, UsageError, chat_template
from specstate.serve.config import Option, ServerConfig
from specstate.serve.request import RequestLimits

#: Every option of a ServerConfig field, with the field; then the request limits (the field ``limits``).
CONFIG_OPTIONS = [(f, f.metadata["option"]) for f in dataclasses.fields(ServerConfig) if "option" in f.metadata]
LIMIT_OPTIONS = [
    (f, Option(f.metadata["help"], low=f.metadata["low"], high=f.metadata["high"]))
    for f in dataclasses.fields(RequestLimits)
]


def _dest(spec: dataclasses.Field[Any], option: Option) -> str:
    return option.name or spec.name


RANGES = (
    N_CTX,
    Range("port", 0, 65535),
    *(
        Range(_dest(spec, option), option.low, option.high if option.high is not None else float("inf"))
        for spec, option in CONFIG_OPTIONS + LIMIT_OPTIONS
        if option.low is not None
    ),
)


#: The fields whose values are one of a few names, by their type's name.
CHOICES: dict[str, Any] = {"Mode": Mode, "DraftPolicy": DraftPolicy}


def add_parser(commands: Any) -> None:
    serve = commands.add_parser("serve", help="an OpenAI-compatible HTTP server (needs the server extra)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    for spec, option in CONFIG_OPTIONS + LIMIT_OPTIONS:
        _add_option(serve, spec, option)


def _add_option(parser: argparse.ArgumentParser, spec: dataclasses.Field[Any], option: Option) -> None:
    """The option of one field: its type from the field's, its default from the field's (in the option's unit)."""
    flag = "--" + _dest(spec, option).replace("_", "-")
    if spec.default is dataclasses.MISSING:
        parser.add_argument(flag, type=Path, required=True, help=option.help)
    elif spec.type == "bool":
        parser.add_argument(flag, action="store_true", help=option.help)
    elif spec.type in CHOICES:
        choices = get_args(CHOICES[spec.type])
        parser.add_argument(flag, choices=choices, default=spec.default, help=f"{option.help} (default {spec.default})")
    elif spec.type == "int":
        default = spec.default // option.unit
        parser.add_argument(flag, type=int, default=default, help=f"{option.help} (default {default})")
    else:
        parser.add_argument(flag, type=Path if option.path else str, help=option.help)


def _value(args: argparse.Namespace, spec: dataclasses.Field[Any], option: Option) -> Any:
    """The field's value from its option (None for an option not given)."""
    value = getattr(args, _dest(spec, option))
    if value is None or isinstance(value, (bool, str)):
        return value
    return str(value) if isinstance(value, Path) else value * option.unit


def config_of(args: argparse.Namespace) -> ServerConfig:
    """The :class:`ServerConfig` the options give (``--template`` read, the API key from its variable if not given)."""
    from specstate.serve.config import API_KEY_VARIABLE

    settings = {spec.name: _value(args, spec, option) for spec, option in CONFIG_OPTIONS}
    settings["chat_template"] = chat_template(args.template)
    settings["api_key"] = args.api_key or os.environ.get(API_KEY_VARIABLE) or None
    limits = RequestLimits(**{spec.name: _value(args, spec, option) for spec, option in LIMIT_OPTIONS})
    return ServerConfig(limits=limits, **settings)


def run(args: argparse.Namespace) -> None:
    try:
        from specstate.serve import serve
    except ImportError as error:
        raise UsageError(f"specstate serve needs the server extra: pip install 'specstate[server]' ({error})") from None
    config = config_of(args)
    sys.stderr.write(f"specstate serve: http://{args.host}:{args.port}/v1 ({config.name()}, mode {config.mode})\n")
    serve(config, args.host, args.port)
