"""Every third-party module imported under ``src/`` is declared in ``pyproject.toml``.

An import is allowed when its distribution is in ``dependencies``, or when it is in an extra
and the import is *guarded*: inside a ``try`` whose ``except ImportError`` names the extra
(``fedforge[<extra>]``), or in a package whose ``__init__`` imports such a guard first. Read
from the source text, so imports inside functions count too, and a module imported only on
a developer's machine (where it happens to be installed) cannot slip through.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "fedforge"
PYPROJECT = ROOT / "pyproject.toml"

# Import names whose distribution is named differently on the package index.
DISTRIBUTION = {"yaml": "pyyaml", "tomli_w": "tomli-w", "pydantic_core": "pydantic-core",
                "dp_accounting": "dp-accounting", "PIL": "pillow"}
IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError"}


def _normalise(requirement: str) -> str:
    """``flwr[simulation]>=1.21; python_version < '3.11'`` -> ``flwr``."""
    return re.split(r"[\[<>=!~;\s]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def declared() -> tuple[set[str], dict[str, set[str]]]:
    """(core distributions, {extra: distributions}) from ``pyproject.toml``."""
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    core = {_normalise(r) for r in project["dependencies"]}
    extras = {name: {_normalise(r) for r in reqs}
              for name, reqs in project.get("optional-dependencies", {}).items()}
    return core, extras


def _third_party(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        names = [node.module]
    else:
        return []
    tops = {name.split(".")[0] for name in names}
    return sorted(t for t in tops if t != "fedforge" and t not in sys.stdlib_module_names)


def _names_an_extra(handler: ast.ExceptHandler, extras: set[str]) -> bool:
    text = " ".join(n.value for n in ast.walk(handler)
                    if isinstance(n, ast.Constant) and isinstance(n.value, str))
    return any(f"fedforge[{extra}]" in text for extra in extras)


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    caught = handler.type
    names = caught.elts if isinstance(caught, ast.Tuple) else [caught]
    return any(isinstance(n, ast.Name) and n.id in IMPORT_ERRORS for n in names)


def _guarded_nodes(tree: ast.AST, extras: set[str]) -> set[int]:
    """ids of import nodes inside a ``try`` whose ImportError handler names one of ``extras``."""
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                _catches_import_error(h) and _names_an_extra(h, extras) for h in node.handlers):
            guarded.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return guarded


def _package_guard(path: Path, extras: set[str]) -> bool:
    """The file's package ``__init__`` first imports a module holding a guarded import."""
    init = path.parent / "__init__.py"
    if path.parent == SRC or not init.exists():
        return False
    package = "fedforge." + ".".join(path.parent.relative_to(SRC).parts)
    for stmt in ast.parse(init.read_text(encoding="utf-8")).body:
        if isinstance(stmt, ast.ImportFrom) and stmt.module == package and stmt.names:
            guard = path.parent / f"{stmt.names[0].name}.py"
            tree = ast.parse(guard.read_text(encoding="utf-8"))
            return bool(_guarded_nodes(tree, extras))
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            return False
    return False


def undeclared_imports() -> list[str]:
    """``file:line: module`` for each import that is neither a dependency nor guarded."""
    core, extras = declared()
    problems = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            for top in _third_party(node):
                dist = DISTRIBUTION.get(top, top).lower().replace("_", "-")
                if dist in core:
                    continue
                in_extras = {name for name, dists in extras.items() if dist in dists}
                where = f"{path.relative_to(ROOT)}:{node.lineno}: {top}"
                if not in_extras:
                    problems.append(f"{where} (in no dependency or extra)")
                elif id(node) not in _guarded_nodes(tree, in_extras) and not _package_guard(
                        path, in_extras):
                    problems.append(f"{where} (extra {sorted(in_extras)} but not guarded)")
    return problems


def test_every_import_is_declared_or_guarded():
    problems = undeclared_imports()
    assert problems == [], "\n".join(problems)


def test_the_check_sees_an_undeclared_import(tmp_path, monkeypatch):
    """The check above can fail: a module importing scipy fails once scipy is undeclared."""
    core, _ = declared()
    assert "scipy" in core
    text = PYPROJECT.read_text(encoding="utf-8")
    fake = tmp_path / "pyproject.toml"
    fake.write_text(re.sub(r'^\s*"scipy[^\n]*\n', "", text, flags=re.M), encoding="utf-8")
    monkeypatch.setattr(sys.modules[__name__], "PYPROJECT", fake)
    assert any(p.endswith("scipy (in no dependency or extra)") for p in undeclared_imports())


@pytest.mark.parametrize("source, ok", [
    ("import flwr", False),
    ("try:\n    import flwr\nexcept ImportError as e:\n    raise ImportError("
     "\"pip install 'fedforge[flower]'\") from e", True),
    ("try:\n    import flwr\nexcept ImportError:\n    raise ImportError('no flwr')", False),
])
def test_an_extras_import_needs_a_guard_naming_it(source, ok):
    tree = ast.parse(source)
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.Import))
    assert (id(node) in _guarded_nodes(tree, {"flower"})) is ok
