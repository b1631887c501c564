"""The server's former module name: :mod:`specstate.serve` has it all (kept so that existing imports work)."""

from __future__ import annotations

from specstate.serve import API_KEY_VARIABLE, RequestError, RequestLimits, ServerConfig, build_app, running, serve

__all__ = ["API_KEY_VARIABLE", "RequestError", "RequestLimits", "ServerConfig", "build_app", "running", "serve"]
