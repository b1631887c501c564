"""``specstate serve``: an OpenAI-compatible HTTP server over :class:`specstate.Llama` (needs the server extra).

Modules, each one concern, none importing another in a circle:

- :mod:`~specstate.serve.request`: how a request is read (one step for both backends) and its limits;
- :mod:`~specstate.serve.config`: :class:`ServerConfig`, what the server runs (and the command line's options);
- :mod:`~specstate.serve.jobs`: what a request becomes inside the server, its results, the counters;
- :mod:`~specstate.serve.cache`: conversations that come back;
- :mod:`~specstate.serve.scheduler`: the queue, priorities and parking;
- :mod:`~specstate.serve.slots`: the slot backend (threads that each own a ``Llama``);
- :mod:`~specstate.serve.ray`: the Ray backend: the slot backend on each of several Ray workers, and the driver
  that places requests on them and streams their results back (the worker actor in
  :mod:`~specstate.serve.ray_worker`);
- :mod:`~specstate.serve.app`: HTTP (Starlette under uvicorn).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from specstate.serve.config import API_KEY_VARIABLE, ServerConfig
from specstate.serve.request import RequestError, RequestLimits

if TYPE_CHECKING:
    from specstate.serve.app import Server, build_app, running, serve

__all__ = [
    "API_KEY_VARIABLE",
    "RequestError",
    "RequestLimits",
    "Server",
    "ServerConfig",
    "build_app",
    "running",
    "serve",
]


def __getattr__(name: str) -> Any:
    """The HTTP side (Starlette, uvicorn: the server extra) is imported when first used, so that the command line
    and the request step work without it."""
    if name in ("Server", "build_app", "running", "serve"):
        from specstate.serve import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
