"""Flower bridge (``pip install 'fedforge[flower]'``): fedforge algorithms as Flower apps."""

from fedforge.flower import common  # noqa: F401  (first: a clear error without the extra)
from fedforge.flower.bridge import (
    ServerOptions,
    aggregate,
    build_apps,
    client_app,
    local_train,
    run_server,
    server_app,
    validate_reply,
)

__all__ = ["ServerOptions", "aggregate", "build_apps", "client_app", "local_train",
           "run_server", "server_app", "validate_reply"]
