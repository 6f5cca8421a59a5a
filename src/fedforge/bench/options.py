"""The options every ``fedforge bench`` command shares, and where a bench writes.

Each workload's command is a function in its own module (``throughput.w1``,
``population.population`` ...) whose parameters are its options. It writes the table's
result record (:mod:`fedforge.bench.results`) and returns the table, which the command line
prints; a bad option raises ``ValueError`` (or
``OSError``) with a message that names it, which the command line prints as one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fedforge.bench.report import default_results
from fedforge.experiment.rundir import folder_option

Out = Annotated[str, typer.Option(
    "--out", metavar="PATH",
    help="the bench's folder: its runs, --profile traces and, away from the fedforge "
         "checkout, its results/ folder")]
"""Text, not a ``Path``: an empty ``--out`` would read as the current folder."""
Results = Annotated[Path | None, typer.Option(
    metavar="FOLDER",
    help="folder of result records (one JSON file per table) and of the RESULTS.md made "
         "from them (default: benchmarks/results, whose page is benchmarks/RESULTS.md, when "
         "run from the fedforge checkout, else results/ in --out)")]
Device = Annotated[str, typer.Option(help="cpu | cuda")]
Profile = Annotated[bool, typer.Option(
    "--profile", help="torch profiler trace of each row in OUT/profile/ and its top kernels")]
Groups = Annotated[int, typer.Option(
    help="round-robin groups (each framework once per group, fresh process)")]
Warmup = Annotated[int, typer.Option(help="untimed iterations (rounds) first")]
Iterations = Annotated[int, typer.Option(help="timed iterations (rounds)")]


def folders(out: str, results: Path | None) -> tuple[Path, Path]:
    """The bench's folder (``--out``) and the folder its result record goes to
    (``--results``, by default :func:`~fedforge.bench.report.default_results`)."""
    folder = folder_option("--out", out)
    return folder, results or default_results(folder)
