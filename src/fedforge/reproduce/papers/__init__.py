"""Built-in reproductions; importing this package registers them."""

from fedforge.reproduce.papers import fadamgc, fedast, fednar  # noqa: F401
from fedforge.reproduce.papers import fedptr, safl  # noqa: F401
