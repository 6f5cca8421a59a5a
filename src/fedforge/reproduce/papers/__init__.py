"""Built-in reproductions; importing this package registers them."""

from fedforge.reproduce.papers import fadamgc, fedast, fednar, fedptr, safl  # noqa: F401
