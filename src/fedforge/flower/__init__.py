"""Flower bridge (``pip install 'fedforge[flower]'``): fedforge algorithms as Flower apps."""

from fedforge.flower.bridge import (
    aggregate,
    build_apps,
    client_app,
    local_train,
    run_server,
    server_app,
    validate_reply,
)

__all__ = ["aggregate", "build_apps", "client_app", "local_train", "run_server", "server_app",
           "validate_reply"]
