"""``fedforge reproduce NAME``: run a paper's claim as a grid, then write its verdict.

A reproduction (:class:`~fedforge.reproduce.spec.Reproduction`) names a claim, a grid of
conditions × seeds, a target and the paired comparisons to report. :func:`reproduce` runs the
missing runs (resuming unfinished ones), copies each run's ``metrics.jsonl`` to
``<data>/<name>/``, and writes ``<out>/reproductions/<name>.md`` and its figures
(``<out>/img/``) from those files. The output folder defaults to ``reproductions/<name>``
below the current folder, never the installed package; a maintainer rewrites the
repository's committed pages with ``out=Path("docs")``. See docs/reproducing.md for the
protocol.
"""

from __future__ import annotations

from pathlib import Path

from fedforge.reproduce.papers import get_reproduction
from fedforge.reproduce.spec import (
    REPRODUCTIONS,
    Comparison,
    Condition,
    Reproduction,
    Sweep,
    register,
)

__all__ = ["REPRODUCTIONS", "Comparison", "Condition", "Reproduction", "Sweep",
           "default_out", "get_reproduction", "register", "reproduce"]


def default_out(name: str) -> Path:
    """``./reproductions/<name>``: results land beside the user, never in the package."""
    return Path.cwd() / "reproductions" / name


def reproduce(
    spec: Reproduction | str, *, root: Path = Path("."), runs: Path | None = None,
    data: Path | None = None, out: Path | None = None, report_only: bool = False,
    progress: bool = True, allow_processes: bool = False,
) -> Path:
    """Run the grid (unless ``report_only``) and write the report; -> the report page.
    ``allow_processes``: as for :func:`fedforge.run_experiment` (the command passes True).

    Defaults: runs in ``<root>/runs/reproduce``, raw metrics in ``<root>/docs/data`` (where
    a source checkout commits them), the page and figures in :func:`default_out`."""
    from fedforge.reproduce.grid import run_grid
    from fedforge.reproduce.report import write_report

    spec = get_reproduction(spec) if isinstance(spec, str) else spec
    runs = runs or root / "runs" / "reproduce"
    data = data or root / "docs" / "data"
    out = out or default_out(spec.name)
    if not report_only:
        run_grid(spec, root=root, runs=runs, data=data, progress=progress,
                 allow_processes=allow_processes)
    return write_report(spec, data, out, command=f"fedforge reproduce {spec.name}")
