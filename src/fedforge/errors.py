"""The library's own exceptions, in a leaf module so that every layer can raise them."""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad configuration; the message starts with the field's dotted path.

    The message is always one printable line (line breaks and control characters are
    escaped), so a hostile value can neither break the CLI's one-line error nor send
    terminal escape sequences.
    """

    def __init__(self, message: object) -> None:
        text = str(message)
        super().__init__("".join(c if c.isprintable() else repr(c)[1:-1] for c in text))
