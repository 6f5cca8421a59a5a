"""The library's own exceptions and the one-line form of pydantic's errors, in a leaf module
so that every layer can raise and format them."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # only a type here: the low layers that raise ConfigError need no pydantic
    from pydantic import ValidationError


class ConfigError(ValueError):
    """A bad configuration; the message starts with the field's dotted path.

    The message is always one printable line (line breaks and control characters are
    escaped), so a hostile value can neither break the CLI's one-line error nor send
    terminal escape sequences.
    """

    def __init__(self, message: object) -> None:
        text = str(message)
        super().__init__("".join(c if c.isprintable() else repr(c)[1:-1] for c in text))


def field_part(part: Any) -> str:
    """A dotted-path component as written, quoted when it is not a plain name (``':'``)."""
    text = str(part)
    return text if re.fullmatch(r"[\w\-]+", text) else repr(text)


def shorten(text: str, limit: int = 80) -> str:
    """``text`` cut to ``limit`` characters (a hostile value cannot flood the message)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def format_error(err: ValidationError, raw: Any, prefix: str = "") -> str:
    """``field.path: message (got value)`` for pydantic's first error; ``prefix`` goes in
    front (``tasks[1].``). The path stops where ``raw`` stops, so it names what the user
    wrote (no pydantic union-member tags)."""
    first = err.errors()[0]
    path = prefix + _path(_loc_in(raw, first["loc"], first["type"]))
    msg = first["msg"].removeprefix("Value error, ")
    return f"{path.lstrip('.') or 'config'}: {msg}{got(first.get('input'))}"


def got(value: Any) -> str:
    """`` (got <value>)`` for a message about a value; nothing for a section or a list."""
    return "" if isinstance(value, (dict, list)) else f" (got {shorten(repr(value))})"


def _path(loc: list) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{field_part(p)}" for p in loc)


def _loc_in(raw: Any, loc: tuple, kind: str) -> list:
    """The part of ``loc`` that exists in ``raw`` (plus a missing key for "Field required")."""
    out, node = [], raw
    for part in loc:
        if isinstance(node, dict) and part in node or (
                isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)):
            out.append(part)
            node = node[part]
            continue
        if isinstance(node, dict) and kind == "missing":
            out.append(part)
        break
    return out
