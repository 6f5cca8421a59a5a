"""The layer contract: no module imports from a layer above its own, and no import circles.

fedforge is built in layers (drawn in ``docs/architecture.md``). A module may import its own
package and any package in a lower layer; packages that share a layer are independent of each
other. The check reads the source text with ``ast``, so an import inside a function counts as
much as one at the top: a lazy import still ties the two modules together, it only hides the
tie until the function runs. Imports under ``if TYPE_CHECKING:`` count too (a type named from
a higher layer is still a dependency on it). Importing ``fedforge.a.b`` also runs the package
``fedforge.a``; that implicit edge is not counted, only the modules an import statement names.

``KNOWN`` lists the upward imports and ``KNOWN_CIRCLES`` the circle-closing imports that are
still on main, each with the file that has to change; an entry that is no longer needed
fails the test, so the lists only shrink.

The picture of the layers in ``docs/architecture.md`` is read back and must equal ``LAYERS``.
No module names a concrete client store, scheduler or driver class (``DiskClientStore``,
``AsyncScheduler``, ...) in an ``isinstance`` or ``type(x) is`` check outside the folder that
defines it: a caller asks the protocol, never which class it holds.

The last test imports the lower layers in a child interpreter where ``fedforge.experiment``
cannot be imported at all, which catches what the source text cannot (an ``importlib`` call).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "fedforge"
DOC = SRC.parents[1] / "docs" / "architecture.md"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("core", "errors"),  # pytrees, schedules, the client store, config text; the exceptions
    ("data", "models", "comm", "client", "distill"),  # what a client trains on, with, and sends
    ("server",),  # the server chain and optimizers
    ("protocol",),  # what an algorithm declares and the engine reads
    ("algorithms", "engine"),  # parts + paper defaults + the registry; the local update, cohorts
    ("robust", "privacy", "sim", "plugins"),  # around the round; the clock, delays and costs
    ("schedulers",),  # FedAST, Sync-ST, buffered servers, jobs mode and its scatter
    ("experiment",),  # config, the run loop, metrics, checkpoints
    ("study",),  # compare, sweep, figures, reports, statistics, the config reference
    ("commands",),  # what the commands share: printing, one-line errors, common options
    ("pretrain",),  # centralised pre-training runs
    ("reproduce", "bench", "flower"),  # paper reproductions, benchmarks, the Flower bridge
    ("cli",),  # the `fedforge` command
    ("__main__", "fedforge"),  # `python -m fedforge`, the package's top-level API
)
"""Bottom to top. A name is a package (or module) directly under ``fedforge``; ``fedforge``
itself stands for the package's ``__init__``."""

KNOWN: dict[tuple[str, str], str] = {}
"""(importing module, imported module or package) -> why it is still there."""

KNOWN_CIRCLES: dict[tuple[str, str], str] = {}
"""Imports that close a circle between modules, (importer, imported) -> why. No plugin
registry needs one: ``fedforge.plugins`` imports the registries, never the reverse."""


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "fedforge"


LAYER_OF = {unit: i for i, units in enumerate(LAYERS) for unit in units}


def _modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _targets(node: ast.AST, module: str, is_package: bool, modules: dict) -> list[str]:
    """The fedforge modules an import statement names (a name that is a submodule counts as
    that submodule; anything else as the module it is taken from)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            package = module.split(".") if is_package else module.split(".")[:-1]
            keep = len(package) - (node.level - 1)
            base = ".".join(package[:keep] + ([node.module] if node.module else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                 for a in node.names]
    else:
        return []
    out = []
    for name in names:
        if name != "fedforge" and not name.startswith("fedforge."):
            continue
        while name not in modules and "." in name:
            name = name.rsplit(".", 1)[0]
        if name != module:
            out.append(name)
    return out


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {imported fedforge module: first line}, from every import statement."""
    modules = _modules()
    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            for target in _targets(node, module, path.name == "__init__.py", modules):
                edges.setdefault(target, node.lineno)
        graph[module] = edges
    return graph


def _known(table: dict, module: str, target: str) -> tuple[str, str] | None:
    for src, dst in table:
        if module == src and (target == dst or target.startswith(dst + ".")):
            return (src, dst)
    return None


def _upward(graph) -> tuple[list[str], set]:
    bad, used = [], set()
    for module, edges in sorted(graph.items()):
        for target, line in sorted(edges.items()):
            here, there = _unit(module), _unit(target)
            if here == there or LAYER_OF[there] < LAYER_OF[here]:
                continue
            key = _known(KNOWN, module, target)
            if key is not None:
                used.add(key)
                continue
            kind = "a layer above" if LAYER_OF[there] > LAYER_OF[here] else "its own layer"
            bad.append(f"{module} (line {line}) imports {target}, from {kind} ({there})")
    return bad, used


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_every_package_has_a_layer():
    units = {_unit(m) for m in _modules()}
    assert units - set(LAYER_OF) == set(), "add the new package to LAYERS"
    assert set(LAYER_OF) - units == set(), "LAYERS names a package that no longer exists"


def test_no_module_imports_from_a_higher_layer():
    bad, used = _upward(import_graph())
    assert bad == [], "\n".join(bad)
    stale = sorted(set(KNOWN) - used)
    assert stale == [], f"fixed, remove from KNOWN: {stale}"


def test_no_import_circles():
    graph = import_graph()
    used = set()
    cut: dict[str, set[str]] = {}
    for module, edges in graph.items():
        cut[module] = set()
        for target in edges:
            key = _known(KNOWN_CIRCLES, module, target)
            if key is None:
                cut[module].add(target)
            else:
                used.add(key)
    circles = _circles(cut)
    assert circles == [], "\n".join(" <-> ".join(c) for c in circles)
    stale = sorted(set(KNOWN_CIRCLES) - used)
    assert stale == [], f"no longer imported, remove from KNOWN_CIRCLES: {stale}"
    closing = sorted(k for k in KNOWN_CIRCLES if _circles({**cut, k[0]: cut[k[0]] | {k[1]}}))
    assert closing == sorted(KNOWN_CIRCLES), (
        f"no longer closes a circle, remove from KNOWN_CIRCLES: "
        f"{sorted(set(KNOWN_CIRCLES) - set(closing))}")


def test_the_contract_sees_lazy_and_relative_imports():
    """The checker itself: imports inside a function or ``TYPE_CHECKING``, relative or not,
    are edges, to the submodule they name."""
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
              "    from fedforge.experiment import runner\n"
              "def f():\n    from ..engine import base\n    import fedforge.robust.hook\n")
    modules = _modules()
    found = [t for node in ast.walk(ast.parse(source))
             for t in _targets(node, "fedforge.sim.clock", False, modules)]
    assert sorted(found) == ["fedforge.engine.base", "fedforge.experiment.runner",
                             "fedforge.robust.hook"]
    bad, _ = _upward({"fedforge.sim.clock": dict.fromkeys(found, 1)})
    assert [b.split(" from ")[1] for b in bad] == ["a layer above (experiment)",
                                                   "its own layer (robust)"]


def doc_layers(text: str) -> tuple[tuple[str, ...], ...]:
    """The layer picture under ``## Layers``, bottom to top: one line of names a layer
    (``·`` or ``,`` between them, a parenthesis a comment), ``│`` the stairs between."""
    block = text.split("\n## Layers\n", 1)[1].split("```\n", 2)[1]
    rows = []
    for line in block.splitlines():
        names = line.split("(", 1)[0].strip()
        if names and names != "│":
            rows.append(tuple(n.strip() for n in re.split(r"[·,]", names)))
    return tuple(reversed(rows))


def test_the_architecture_picture_is_the_layer_list():
    text = DOC.read_text(encoding="utf-8")
    assert doc_layers(text) == LAYERS, "docs/architecture.md's layer picture differs from LAYERS"
    swapped = text.replace("  study\n", "  @@\n").replace("  experiment\n", "  study\n")
    assert doc_layers(swapped.replace("  @@\n", "  experiment\n")) != LAYERS  # it can fail


CONCRETE = re.compile(r"(Store|Scheduler|Driver)$")
"""A class so named, and not a ``Protocol``, is a concrete store, scheduler or driver."""


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    return node.attr if isinstance(node, ast.Attribute) else None


def concrete_classes(modules: dict[str, Path]) -> dict[str, set[str]]:
    """class name -> the packages (folders under ``fedforge``) that define it."""
    out: dict[str, set[str]] = {}
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if (isinstance(node, ast.ClassDef) and CONCRETE.search(node.name)
                    and "Protocol" not in {_name(b) for b in node.bases}):
                out.setdefault(node.name, set()).add(_unit(module))
    return out


def _checked_names(node: ast.AST) -> list[str]:
    """The class names an ``isinstance``/``issubclass`` call or a ``type(x) is C`` compares
    against."""
    if isinstance(node, ast.Call) and _name(node.func) in ("isinstance", "issubclass"):
        if len(node.args) < 2:
            return []
        arg = node.args[1]
        parts = arg.elts if isinstance(arg, ast.Tuple) else [arg]
        return [n for n in map(_name, parts) if n]
    if (isinstance(node, ast.Compare) and isinstance(node.left, ast.Call)
            and _name(node.left.func) == "type"):
        return [n for n in map(_name, node.comparators) if n]
    return []


def class_checks(source: str, module: str, classes: dict[str, set[str]]) -> list[str]:
    """``module``'s checks on a concrete class defined outside its folder."""
    return [f"{module} (line {node.lineno}) checks isinstance on {name}"
            for node in ast.walk(ast.parse(source))
            for name in _checked_names(node)
            if name in classes and _unit(module) not in classes[name]]


def test_no_module_asks_which_store_or_scheduler_it_holds():
    modules = _modules()
    classes = concrete_classes(modules)
    assert {"ClientStore", "DiskClientStore", "ShardedDiskClientStore", "AsyncScheduler",
            "SyncScheduler", "RoundsDriver", "TasksDriver"} <= set(classes)
    assert "StateStore" not in classes and "Scheduler" not in classes  # the protocols
    bad = [b for module, path in sorted(modules.items())
           for b in class_checks(path.read_text(encoding="utf-8"), module, classes)]
    assert bad == [], "\n".join(bad)


def test_the_class_check_sees_isinstance_and_type():
    classes = concrete_classes(_modules())
    source = ("def f(s, t):\n    if isinstance(s, (int, store.DiskClientStore)):\n"
              "        return type(t) is AsyncScheduler\n    return isinstance(s, StateStore)\n")
    assert class_checks(source, "fedforge.experiment.drivers", classes) == [
        "fedforge.experiment.drivers (line 2) checks isinstance on DiskClientStore",
        "fedforge.experiment.drivers (line 3) checks isinstance on AsyncScheduler"]
    assert class_checks("isinstance(s, DiskClientStore)", "fedforge.core.store", classes) == []


CHILD = """
import importlib, json, sys
import torch  # not ours and slow to import: loaded once, kept across the modules
names = json.loads(sys.argv[1])
failures = []
for name in names:
    for key in [k for k in sys.modules if k == "fedforge" or k.startswith("fedforge.")]:
        del sys.modules[key]
    sys.modules["fedforge.experiment"] = None  # importing it raises ImportError
    try:
        importlib.import_module(name)
    except Exception as exc:  # report every module, not just the first
        failures.append(f"{name}: {type(exc).__name__}: {exc}")
print(json.dumps(failures))
"""


def _lower_modules() -> list[str]:
    names = []
    for pkg in ("protocol", "sim", "engine", "server", "schedulers"):
        for path in sorted((SRC / pkg).glob("*.py")):
            stem = path.stem
            names.append(f"fedforge.{pkg}" if stem == "__init__" else f"fedforge.{pkg}.{stem}")
    return names


def test_lower_layers_import_without_the_runner():
    names = _lower_modules()
    assert "fedforge.schedulers.multitask_sync" in names and "fedforge.schedulers.jobs" in names
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(names)], capture_output=True,
                         text=True, timeout=300, check=True)
    failures = json.loads(out.stdout.strip().splitlines()[-1])
    assert failures == [], "\n".join(failures)


def test_no_asyncfl_package():
    """The asynchronous code lives in schedulers/, sim/ and server/; no shim package is left."""
    assert not (SRC / "asyncfl").exists()
