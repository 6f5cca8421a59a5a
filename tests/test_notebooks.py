"""Every notebook under ``docs/`` runs top to bottom, as a reader runs it.

The code cells are executed in order in one namespace, from a scratch folder that holds a
copy of ``examples/`` (notebooks are run from the repository root), so nothing is written
into the checkout. No Jupyter kernel is needed for that.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import matplotlib
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "docs").rglob("*.ipynb"))


def code_cells(path: Path) -> list[str]:
    notebook = json.loads(path.read_text(encoding="utf-8"))
    return ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code"]


def test_there_is_a_notebook():
    assert NOTEBOOKS, "docs/ should hold at least one notebook"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_notebook_runs(path, tmp_path, monkeypatch):
    matplotlib.use("Agg")
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for i, source in enumerate(code_cells(path)):
        try:
            exec(compile(source, f"{path.name}[cell {i}]", "exec"), namespace)  # noqa: S102
        except Exception as exc:  # name the cell that failed
            raise AssertionError(f"{path.name}, code cell {i}: {exc!r}") from exc
    assert (tmp_path / "runs").is_dir()
