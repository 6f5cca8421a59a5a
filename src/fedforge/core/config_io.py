"""Bounded parsing of config text: a hostile file or override cannot hang, exhaust memory or
crash the parser, and what it yields is plain data (tables, lists, strings, numbers, booleans).

Limits (all raise :class:`InputError`, which ``config.py`` turns into a one-line
``ConfigError`` naming the file or override):

* ``MAX_CONFIG_BYTES``: a config file is read up to this size and refused beyond it;
* ``MAX_DEPTH``: tables and lists nested deeper than this (after YAML aliases are expanded);
* ``MAX_VALUES``: values in the document after YAML aliases are expanded (stops
  "billion laughs" alias bombs, which are tiny on disk but huge once expanded);
* a YAML alias that refers to its own anchor (a recursive structure) is refused;
* a key written twice in one YAML mapping is refused, as TOML refuses it.

YAML is read with YAML 1.2 core-schema scalars: only ``true``/``false`` are booleans (not
``yes``/``on``), ``1:30`` is a string (not sexagesimal 90), dates stay strings, and a leading
zero does not make an octal number.
"""

from __future__ import annotations

import re
import sys
from typing import Any

import yaml

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

MAX_CONFIG_BYTES = 1 << 20  # 1 MiB; real configs are a few KiB
MAX_DEPTH = 32  # nested tables/lists; real configs use at most ~6
MAX_VALUES = 100_000  # values after alias expansion


class InputError(ValueError):
    """Config text that cannot be parsed safely; the message has no file name."""


class Unparsable(InputError):
    """Not valid TOML/YAML (as opposed to valid but past a limit)."""


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core scalars and bounded nesting and alias expansion."""

    yaml_implicit_resolvers: dict = {}  # filled below; not shared with SafeLoader

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._sizes: dict[int, int] = {}  # id(node) -> values in the expanded node

    def compose_node(self, parent: Any, index: Any) -> yaml.Node:
        if self.check_event(yaml.AliasEvent):
            anchor = self.peek_event().anchor
            node = self.anchors.get(anchor)
            if node is not None and id(node) not in self._sizes:
                raise InputError(f"YAML alias *{anchor} refers to its own anchor (a recursive "
                                 "structure)")
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise InputError(f"nested deeper than {MAX_DEPTH} levels")
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            children = []
        size = 1 + sum(self._sizes[id(c)] for c in children)
        if size > MAX_VALUES:
            raise InputError(f"more than {MAX_VALUES} values once YAML aliases are expanded")
        self._sizes[id(node)] = size
        return node


    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        """Refuse a key written twice in one mapping (TOML refuses it too); keys brought in by
        a ``<<`` merge may still be overridden, as YAML intends."""
        seen: set = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: SafeConstructor reports it
                break
            if duplicate:
                line = key_node.start_mark.line + 1
                raise InputError(f"duplicate key {key!r} at line {line} (each key may appear "
                                 "once in a table)")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_RESOLVERS = [
    ("bool", r"true|True|TRUE|false|False|FALSE", "tTfF"),
    ("int", r"[-+]?(?:0|[1-9][0-9]*)|0o[0-7]+|0x[0-9a-fA-F]+", "-+0123456789"),
    ("float", r"[-+]?(?:\.[0-9]+|(?:0|[1-9][0-9]*)(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
              r"|[-+]?\.?(?:inf|Inf|INF)|\.?(?:nan|NaN|NAN)", "-+0123456789.iInN"),
    ("null", r"~|null|Null|NULL|", ["~", "n", "N", ""]),
    ("merge", r"<<", "<"),
]
for _tag, _pattern, _first in _RESOLVERS:
    _Loader.add_implicit_resolver(f"tag:yaml.org,2002:{_tag}", re.compile(f"^(?:{_pattern})$"),
                                  list(_first))


def _refuse_tag(loader: _Loader, node: yaml.Node) -> None:
    raise yaml.constructor.ConstructorError(None, None, f"tag {node.tag} is not allowed in a "
                                            "config", node.start_mark)


for _tag in ("timestamp", "binary", "set", "omap", "pairs"):  # not plain data
    _Loader.add_constructor(f"tag:yaml.org,2002:{_tag}", _refuse_tag)
# PyYAML's scalar constructors raise these on explicit tags with bad values (``!!int ''``)
_CONSTRUCT_ERRORS = (ValueError, TypeError, AttributeError, IndexError, KeyError, OverflowError)


def parse_yaml(text: str) -> Any:
    """One YAML document (``None`` if empty), bounded and checked to be plain data."""
    loader = None
    try:
        loader = _Loader(text)  # a SafeLoader: no Python objects
        data = loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise Unparsable(f"invalid YAML: {exc.problem or exc.context}{where}") from None
    except yaml.YAMLError as exc:  # e.g. a control character (ReaderError)
        raise Unparsable(f"invalid YAML: {str(exc).splitlines()[0]}") from None
    except InputError:  # a limit of _Loader (a ValueError, so before the next clause)
        raise
    except _CONSTRUCT_ERRORS as exc:
        raise Unparsable(f"invalid YAML value ({type(exc).__name__}: {exc})") from None
    except RecursionError:
        raise InputError(f"nested deeper than {MAX_DEPTH} levels") from None
    finally:
        if loader is not None:
            loader.dispose()
    check_plain(data)
    return data


def parse_toml(text: str) -> dict:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise Unparsable(f"invalid TOML: {exc}") from None
    except RecursionError:
        raise InputError(f"nested deeper than {MAX_DEPTH} levels") from None
    check_plain(data)
    return data


def decode(data: bytes) -> str:
    """UTF-8 text (a leading byte-order mark is dropped); bytes beyond the cap are refused."""
    if len(data) > MAX_CONFIG_BYTES:
        raise InputError(f"larger than {MAX_CONFIG_BYTES} bytes; is this a config file?")
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                         f"{exc.start})") from None


_PLAIN = (str, bool, int, float, type(None))


def check_plain(data: Any) -> None:
    """Tables with string keys, lists and scalars only, within MAX_DEPTH and MAX_VALUES.

    Iterative, so it cannot overflow the stack; each shared (aliased) value is counted every
    time it appears, as the expanded document would hold it.
    """
    stack: list[tuple[Any, str, int]] = [(data, "", 1)]
    seen = 0
    while stack:
        value, where, depth = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise InputError(f"more than {MAX_VALUES} values")
        if depth > MAX_DEPTH:
            raise InputError(f"{where or 'document'}: nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise InputError(f"{where or 'top level'}: key {key!r} is not a string")
                stack.append((item, f"{where}.{key}" if where else key, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value))
        elif not isinstance(value, _PLAIN):
            kind = type(value).__name__
            raise InputError(f"{where or 'document'}: a {kind} is not a config value (expected "
                             "a table, list, string, number or boolean; quote dates)")


def depth(value: Any) -> int:
    """Nesting depth of plain data already checked by :func:`check_plain`."""
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    return 0

