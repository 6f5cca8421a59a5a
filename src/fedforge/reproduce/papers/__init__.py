"""Built-in reproductions; importing this package registers them."""

from fedforge.reproduce.papers import fadamgc, fedast  # noqa: F401
