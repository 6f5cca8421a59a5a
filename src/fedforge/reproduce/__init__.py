"""``fedforge reproduce NAME``: run a paper's claim as a grid, then write its verdict.

A reproduction (:class:`~fedforge.reproduce.spec.Reproduction`) names a claim, a grid of
conditions × seeds, a target and the paired comparisons to report. :func:`reproduce` runs the
missing runs (resuming unfinished ones), copies each run's ``metrics.jsonl`` to
``docs/data/<name>/``, and regenerates ``docs/reproductions/<name>.md`` and its figures from
those files. See docs/reproducing.md for the protocol.
"""

from __future__ import annotations

from pathlib import Path

from fedforge.reproduce.spec import (
    REPRODUCTIONS,
    Comparison,
    Condition,
    Reproduction,
    Sweep,
    get_reproduction,
    register,
)

__all__ = ["REPRODUCTIONS", "Comparison", "Condition", "Reproduction", "Sweep",
           "get_reproduction", "register", "reproduce"]


def reproduce(
    spec: Reproduction | str, *, root: Path = Path("."), runs: Path | None = None,
    data: Path | None = None, docs: Path | None = None, report_only: bool = False,
    progress: bool = True,
) -> Path:
    """Run the grid (unless ``report_only``) and write the report; -> the report page.

    Defaults, relative to ``root`` (the repository): runs in ``runs/reproduce``, raw
    metrics in ``docs/data``, the page and figures in ``docs``."""
    from fedforge.reproduce.grid import run_grid
    from fedforge.reproduce.report import write_report

    spec = get_reproduction(spec) if isinstance(spec, str) else spec
    runs = runs or root / "runs" / "reproduce"
    data = data or root / "docs" / "data"
    docs = docs or root / "docs"
    if not report_only:
        run_grid(spec, root=root, runs=runs, data=data, progress=progress)
    return write_report(spec, data, docs, command=f"fedforge reproduce {spec.name}")
