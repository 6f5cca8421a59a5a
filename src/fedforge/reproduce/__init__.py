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

from dataclasses import replace
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

__all__ = ["REPRODUCTIONS", "Comparison", "Condition", "Reproduction", "Sweep", "command",
           "default_out", "get_reproduction", "parse_seeds", "register", "report_all",
           "reproduce"]


def default_out(name: str) -> Path:
    """``./reproductions/<name>``: results land beside the user, never in the package."""
    return Path.cwd() / "reproductions" / name


def parse_seeds(text: str) -> tuple[int, ...]:
    """``"0,1,2"`` or ``"0-9"`` (or a mix, ``"0-4,7"``) -> the seeds, in order."""
    seeds: list[int] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        low, _, high = part.partition("-")
        if not (low.isdigit() and (not high or high.isdigit())) or (high and int(high) < int(low)):
            raise ValueError(f"--seeds: expected e.g. 0,1,2 or 0-9, got {text!r}")
        seeds += range(int(low), int(high or low) + 1)
    if not seeds:
        raise ValueError(f"--seeds: expected e.g. 0,1,2 or 0-9, got {text!r}")
    return tuple(dict.fromkeys(seeds))


def _check_data(spec: Reproduction, data: Path) -> None:
    """Refuse a report from a data folder holding none of the spec's runs (e.g. outside the
    checkout): it would be a page of empty rows."""
    if not any((data / spec.name).glob("*/seed*.jsonl")):
        raise ValueError(f"--data {data}: no runs of {spec.name!r} (expected "
                         f"{data / spec.name}/<condition>/seed<k>.jsonl); run from the "
                         "repository root or pass --data PATH")


def reproduce(
    spec: Reproduction | str, *, root: Path = Path("."), runs: Path | None = None,
    data: Path | None = None, out: Path | None = None, report_only: bool = False,
    progress: bool = True, allow_processes: bool = False,
    seeds: tuple[int, ...] | None = None, conditions: tuple[str, ...] | None = None,
    batch_seeds: bool = False,
) -> Path:
    """Run the grid (unless ``report_only``) and write the report; -> the report page.
    ``allow_processes``: as for :func:`fedforge.run_experiment` (the command passes True).
    ``seeds`` / ``conditions``: run only these (the seeds the power rule asks for, or the
    conditions not run yet); the report reads every committed seed. ``batch_seeds``: each
    condition's missing seeds train as one batch where they can (docs/reproducing.md).

    Defaults: runs in ``<root>/runs/reproduce``, raw metrics in ``<root>/docs/data`` (where
    a source checkout commits them), the page and figures in :func:`default_out`."""
    from fedforge.reproduce.grid import run_grid
    from fedforge.reproduce.report import write_report

    spec = get_reproduction(spec) if isinstance(spec, str) else spec
    runs = runs or root / "runs" / "reproduce"
    data = data or root / "docs" / "data"
    out = out or default_out(spec.name)
    for name in conditions or ():
        spec.condition(name)  # a KeyError naming the spec and the condition
    if report_only:
        _check_data(spec, data)
    else:
        run_grid(replace(spec, seeds=seeds or spec.seeds), root=root, runs=runs, data=data,
                 progress=progress, allow_processes=allow_processes, only=conditions,
                 batch_seeds=batch_seeds)
    return write_report(spec, data, out, command=f"fedforge reproduce {spec.name}")


def report_all(data: Path, out: Path) -> Path:
    """Every registered page from the raw metrics, then the summary (``reproductions.md``)
    from the same data and verdicts; -> the summary. ``fedforge reproduce all
    --report-only``. A reproduction whose grid has not run yet gets its page all the same
    (its claim, setting and command, "0 of N runs"); a data folder holding no
    reproduction's runs is refused, as for one name."""
    from fedforge.reproduce.report import write_report
    from fedforge.reproduce.summary import write_summary

    specs = [get_reproduction(name) for name in sorted(REPRODUCTIONS)]
    if not any(next((data / spec.name).glob("*/seed*.jsonl"), None) for spec in specs):
        _check_data(specs[0], data)
    for spec in specs:
        write_report(spec, data, out, command=f"fedforge reproduce {spec.name}")
    return write_summary(specs, data, out)


def command(name: str, *, scale: str, report_only: bool, runs: Path, data: Path,
            out: Path | None, seeds: str | None, conditions: str | None,
            progress: bool, batch_seeds: bool = False) -> Path | str:
    """``fedforge reproduce NAME``: the report page written, or (``scale="paper"``) the text
    of the paper-scale commands. ``all`` rewrites every page and the summary from the raw
    metrics only. A bad option or an unknown name is a ``ValueError`` naming it."""
    from fedforge.reproduce.report import paper_scale

    if scale not in ("cpu", "paper"):
        raise ValueError(f"--scale: expected cpu or paper, got {scale!r}")
    if name == "all":
        if not report_only:
            raise ValueError("reproduce all: only with --report-only (each grid runs on its own)")
        return report_all(data, out or Path("reproductions"))
    try:
        spec = get_reproduction(name)
        if scale == "paper":
            return paper_scale(spec)
        return reproduce(spec, runs=runs, data=data, out=out, report_only=report_only,
                         progress=progress, allow_processes=True,
                         seeds=parse_seeds(seeds) if seeds else None,
                         conditions=tuple(c.strip() for c in conditions.split(","))
                         if conditions else None, batch_seeds=batch_seeds)
    except KeyError as exc:  # an unknown reproduction or --conditions name
        raise ValueError(exc.args[0]) from None
