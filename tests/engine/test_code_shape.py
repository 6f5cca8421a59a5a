"""The code's shape: no function in ``src`` is longer than 80 lines, ``cli.py`` holds only
the command surface (under 400 lines; what a command does lives in the module it calls), and
``experiment/`` holds the run (under 4,500 lines; studies of runs live in ``study/``).

A function's length is counted as ``ast`` gives it, from its ``def`` line to its last line
(decorators not included); methods and nested functions count on their own.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
MAX_FUNCTION_LINES = 80
MAX_CLI_LINES = 399
MAX_EXPERIMENT_LINES = 4499

LONG: dict[str, str] = {}
"""``path:function`` -> why it is still longer than the limit."""


def long_functions(root: Path, limit: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """``path:name`` -> length of every function under ``root`` longer than ``limit`` lines."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    found[f"{path.relative_to(root).as_posix()}:{node.name}"] = length
    return found


def test_no_function_is_longer_than_80_lines():
    found = long_functions(SRC)
    assert {k: v for k, v in found.items() if k not in LONG} == {}
    assert sorted(set(LONG) - set(found)) == [], "no longer needed in LONG"


def test_the_check_counts_from_the_def_line_to_the_last(tmp_path):
    """80 lines pass, 81 do not; a nested function and a method count on their own."""
    body, nested = "    x = 0\n", "        x = 0\n"
    (tmp_path / "ok.py").write_text("@decorated\ndef ok():\n" + body * 79)
    (tmp_path / "long.py").write_text("def long():\n" + body * 80)
    (tmp_path / "inner.py").write_text("class C:\n    def method(self):\n" + nested * 80
                                       + "def outer():\n    def inner():\n" + nested * 80)
    assert long_functions(tmp_path) == {"long.py:long": 81, "inner.py:method": 81,
                                        "inner.py:outer": 82, "inner.py:inner": 81}


def test_cli_is_only_the_command_surface():
    lines = (SRC / "fedforge" / "cli.py").read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_CLI_LINES, f"cli.py has {lines} lines; move what a command does out"


def test_experiment_is_only_the_run():
    lines = sum(p.read_text(encoding="utf-8").count("\n")
                for p in (SRC / "fedforge" / "experiment").glob("*.py"))
    assert lines <= MAX_EXPERIMENT_LINES, (
        f"experiment/ has {lines} lines; what is not the run belongs in another folder")
