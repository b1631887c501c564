"""``specstate serve``: the OpenAI-compatible HTTP server (:mod:`specstate.server`; needs the server extra)."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from specstate.cli._args import MODES, N_CTX, THREADS, U32_MAX, Range, UsageError, chat_template
from specstate.server_request import RequestLimits

#: What one request may ask for: an option each (--max-tokens, --max-messages, ...), from RequestLimits.
LIMITS = fields(RequestLimits)

RANGES = (
    N_CTX,
    Range("n_draft", 1, U32_MAX),
    Range("port", 0, 65535),
    Range("slots", 1, 64),
    Range("queue", 0, 1 << 16),
    THREADS,
    Range("cache_mib", 0, 1 << 20),
    Range("parked_mib", 0, 1 << 20),
    Range("ray_workers", 0, 1024),
    *(Range(limit.name, limit.metadata["low"], min(limit.metadata["high"], U32_MAX)) for limit in LIMITS),
)


def add_parser(commands: Any) -> None:
    serve = commands.add_parser("serve", help="an OpenAI-compatible HTTP server (needs the server extra)")
    serve.add_argument("--model", type=Path, required=True, help="target GGUF model")
    serve.add_argument("--mode", choices=MODES, default="none", help="speculation mode (default none)")
    serve.add_argument("--draft-model", type=Path, help="draft GGUF model (draft and eagle3 modes)")
    serve.add_argument("--n-draft", type=int, default=8, help="most tokens drafted per round (default 8)")
    serve.add_argument(
        "--n-ctx",
        type=int,
        default=4096,
        help="context length of each slot (0: the model's trained length; default 4096)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    serve.add_argument("--slots", type=int, default=1, help="generations run at once (default 1)")
    serve.add_argument("--queue", type=int, default=16, help="requests that may wait for a slot (default 16)")
    serve.add_argument("--threads", type=int, default=0, help="threads per slot (0: the CPUs shared out)")
    serve.add_argument("--template", help="chat template: a Jinja file, or 'chatml' (default: the model's own)")
    serve.add_argument("--model-name", help="the model name clients use (default: the file's name)")
    serve.add_argument("--cache-dir", type=Path, help="keep conversation checkpoints here across restarts")
    serve.add_argument(
        "--cache-mib", type=int, default=1024, help="MiB of conversation checkpoints kept in memory (default 1024)"
    )
    serve.add_argument(
        "--parked-mib", type=int, default=1024, help="MiB of parked replies' checkpoints kept in memory (default 1024)"
    )
    serve.add_argument("--spill-dir", type=Path, help="parked replies' checkpoints beyond --parked-mib go here")
    serve.add_argument(
        "--ray-workers", type=int, default=0, metavar="N", help="serve from N Ray workers (needs the ray extra)"
    )
    serve.add_argument("--ray-address", help="the Ray cluster to join (default: a local instance)")
    serve.add_argument(
        "--api-key", help="require 'Authorization: Bearer KEY' (default: $SPECSTATE_API_KEY, else no key)"
    )
    serve.add_argument(
        "--metrics-public", action="store_true", help="serve /metrics without the API key (for a trusted scraper)"
    )
    for limit in LIMITS:
        option = "--" + limit.name.replace("_", "-")
        serve.add_argument(
            option, type=int, default=limit.default, help=f"{limit.metadata['help']} (default %(default)s)"
        )


def run(args: argparse.Namespace) -> None:
    try:
        from specstate.server import API_KEY_VARIABLE, ServerConfig, serve
    except ImportError as error:
        raise UsageError(f"specstate serve needs the server extra: pip install 'specstate[server]' ({error})") from None
    config = ServerConfig(
        model_path=str(args.model),
        mode=args.mode,
        draft_model_path=None if args.draft_model is None else str(args.draft_model),
        n_draft=args.n_draft,
        n_ctx=args.n_ctx,
        n_threads=args.threads,
        slots=args.slots,
        queue=args.queue,
        limits=RequestLimits(**{limit.name: getattr(args, limit.name) for limit in LIMITS}),
        api_key=args.api_key or os.environ.get(API_KEY_VARIABLE) or None,
        metrics_public=args.metrics_public,
        chat_template=chat_template(args.template),
        model_name=args.model_name,
        cache_bytes=args.cache_mib << 20,
        cache_dir=None if args.cache_dir is None else str(args.cache_dir),
        parked_bytes=args.parked_mib << 20,
        spill_dir=None if args.spill_dir is None else str(args.spill_dir),
        ray_workers=args.ray_workers,
        ray_address=args.ray_address,
    )
    sys.stderr.write(f"specstate serve: http://{args.host}:{args.port}/v1 ({config.name()}, mode {args.mode})\n")
    serve(config, args.host, args.port)
