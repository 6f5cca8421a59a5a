"""Layering: ``sim/``, ``engine/`` and ``server/`` never import the runner (``experiment/``).

The runner imports them, so a module-level import the other way is a cycle waiting for the
wrong import order. Each module is imported first, from a clean slate of fedforge modules,
in a child interpreter where ``fedforge.experiment`` cannot be imported at all.
"""

import json
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "fedforge"
LOWER = ("sim", "engine", "server")

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


def _modules() -> list[str]:
    names = []
    for pkg in LOWER:
        for path in sorted((SRC / pkg).glob("*.py")):
            stem = path.stem
            names.append(f"fedforge.{pkg}" if stem == "__init__" else f"fedforge.{pkg}.{stem}")
    return names


def test_lower_layers_import_without_the_runner():
    names = _modules()
    assert "fedforge.sim.multitask_sync" in names and "fedforge.engine.jobs" in names
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(names)], capture_output=True,
                         text=True, timeout=300, check=True)
    failures = json.loads(out.stdout.strip().splitlines()[-1])
    assert failures == [], "\n".join(failures)


def test_no_asyncfl_package():
    """The asynchronous code lives in sim/, engine/ and server/; no shim package is left."""
    assert not (SRC / "asyncfl").exists()
