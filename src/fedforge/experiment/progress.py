"""What a run shows while it trains, and its optional TensorBoard log.

In a terminal: a rich progress bar naming the algorithm, seed and round, with the latest
accuracy (``compare`` adds which run of how many it is). Without a terminal (output
redirected to a file, a batch job): one plain line per evaluation, flushed at once, so the
log follows the run. Every record (one per round, the test metrics on evaluated rounds) also
goes to the trackers ``[logging]`` switches on: TensorBoard, MLflow, W&B
(:mod:`fedforge.experiment.tracking`), and to the observers of :func:`observe_rounds` (a
sweep's pruner).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from fedforge.experiment.metrics import PER_CLIENT, is_evaluated
from fedforge.experiment.tracking import TensorBoardTracker, Tracker, TrackerFactory, close_all

if TYPE_CHECKING:
    from fedforge.core.machine import Cpu
    from fedforge.experiment.config import RunConfig

_POSITION: ContextVar[str] = ContextVar("fedforge_run_position", default="")
_OBSERVERS: ContextVar[tuple[Callable[[int, dict], None], ...]] = ContextVar(
    "fedforge_round_observers", default=())


@contextmanager
def run_position(text: str) -> Iterator[None]:
    """Runs started inside show ``text`` (e.g. ``run 2/6``) in their progress."""
    token = _POSITION.set(text)
    try:
        yield
    finally:
        _POSITION.reset(token)


@contextmanager
def observe_rounds(fn: Callable[[int, dict], None]) -> Iterator[None]:
    """Runs started inside call ``fn(round, record)`` after each round they record; an
    exception ``fn`` raises stops the run (a sweep prunes a trial that way)."""
    token = _OBSERVERS.set((*_OBSERVERS.get(), fn))
    try:
        yield
    finally:
        _OBSERVERS.reset(token)


SLOW_STEP_S = 2.0  # a set-up step silent for longer than this says what it is doing


@contextmanager
def setup_step(label: str, *, enabled: bool = True, stream: TextIO | None = None,
               after: float | None = None) -> Iterator[None]:
    """Say ``label ...`` once a set-up step has run ``after`` seconds, and how long it took
    when it ends; a step that finishes sooner prints nothing. Building a population of
    100,000 clients takes over a minute, which should not look like a hang."""
    out = stream if stream is not None else sys.stdout
    started, shown = time.perf_counter(), threading.Event()

    def announce() -> None:
        shown.set()
        print(f"{label} ...", file=out, flush=True)

    timer = threading.Timer(SLOW_STEP_S if after is None else after, announce)
    timer.daemon = True
    if enabled:
        timer.start()
    try:
        yield
    finally:
        timer.cancel()
        if shown.is_set():
            print(f"{label}: done in {time.perf_counter() - started:.1f} s", file=out,
                  flush=True)


def _is_terminal(stream: TextIO) -> bool:
    return Console(file=stream).is_terminal


class RoundProgress:
    """Progress over rounds; ``advance`` gets every round and its record (None on ranks
    that write none); only evaluated records change the shown accuracy or print a line.

    Args:
      label: what is running, e.g. ``fedavg seed 0``.
      stream: where progress goes (default stdout); a non-terminal gets one line per
        evaluation instead of a bar.
      tensorboard: a folder for TensorBoard event files (None: none written).
      trackers: opens the run's other trackers on entering (MLflow, W&B).
    """

    def __init__(self, rounds: int, start: int = 1, enabled: bool = True, label: str = "",
                 stream: TextIO | None = None, tensorboard: Path | None = None,
                 trackers: TrackerFactory | None = None) -> None:
        self.enabled = enabled
        self.rounds, self.start = rounds, start
        position = _POSITION.get()
        self.label = " ".join(p for p in (label, f"[{position}]" if position else "") if p)
        self.stream = stream if stream is not None else sys.stdout
        self.lines = enabled and not _is_terminal(self.stream)
        self._tb_dir = tensorboard
        self._open_trackers = trackers
        self.intro = ""  # a line shown at the start (the partition's client sizes)
        self._trackers: list[Tracker] = []
        desc = f"[bold]{_escape(self.label)}[/bold] " if self.label else ""
        self._progress = Progress(
            TextColumn(desc + "round {task.completed}/{task.total}"), BarColumn(),
            TextColumn("{task.fields[status]}"), TimeElapsedColumn(), TimeRemainingColumn(),
            console=Console(file=self.stream), disable=not enabled or self.lines,
        )

    @classmethod
    def for_run(cls, cfg: RunConfig, out: Path, start: int = 1,
                enabled: bool = True) -> RoundProgress:
        """The progress of a run of ``cfg`` writing into ``out`` (its trackers' folders)."""
        from fedforge.engine.threads import describe_threads
        from fedforge.experiment.partition_stats import load_partition_stats, partition_summary
        from fedforge.experiment.tracking import open_trackers

        bar = cls(cfg.rounds, start, enabled, label=f"{cfg.algorithm.name} seed {cfg.seed}",
                  trackers=lambda: open_trackers(cfg, out, start))
        stats = load_partition_stats(out)  # written just before, at the run's start
        if stats is not None:
            bar.intro = f"{stats['dataset']}: {partition_summary(stats)}"
        bar.intro = "; ".join(p for p in (bar.intro, describe_threads(cfg.engine.name),
                                          bf16_hint(cfg)) if p)
        return bar

    def __enter__(self) -> RoundProgress:
        if self._tb_dir is not None:
            self._trackers.append(TensorBoardTracker(self._tb_dir, self.start))
        if self._open_trackers is not None:
            self._trackers += self._open_trackers()
        self._progress.__enter__()
        self._task = self._progress.add_task("rounds", total=self.rounds,
                                             completed=self.start - 1, status="")
        if self.lines:
            span = (f"rounds {self.start}-{self.rounds}" if self.start <= self.rounds
                    else f"all {self.rounds} rounds already done")  # a finished run resumed
            self._line(span + (f"; {self.intro}" if self.intro else ""))
        elif self.enabled and self.intro:
            self._progress.console.print(f"{self.label}: {self.intro}", markup=False,
                                         highlight=False)
        return self

    def advance(self, round_: int, record: dict | None) -> None:
        fields = {}
        if record is not None:
            if is_evaluated(record):
                fields["status"] = _status(record)
                if self.lines:
                    self._line(f"round {round_}/{self.rounds} {_status(record)}" + (
                        f" wall {record['wall_s']:.1f}s" if "wall_s" in record else ""))
            for tracker in self._trackers:
                tracker.log(record, round_)
        self._progress.update(self._task, completed=round_, **fields)
        if record is not None:
            for observe in _OBSERVERS.get():
                observe(round_, record)

    def _line(self, text: str) -> None:
        print(f"{self.label}: {text}" if self.label else text, file=self.stream, flush=True)

    def __exit__(self, *exc) -> None:
        self._progress.__exit__(*exc)
        try:
            close_all(self._trackers, failed=exc[0] is not None)
        except Exception:
            if exc[0] is None:  # else the error that ended the run is the one to report
                raise


def _status(record: dict) -> str:
    parts = [f"{k.removeprefix('test_')} {record[k]:.4f}"
             for k in ("test_accuracy", "test_loss", "test_perplexity")
             if isinstance(record.get(k), (int, float))]
    return " ".join(parts + _personal_status(record))


SHOWN_CLIENTS = 10  # up to this many evaluated clients, the line shows each one's accuracy


def _personal_status(record: dict) -> list[str]:
    """The per-client accuracy of a personalised evaluation (``eval.personal``): its mean,
    10th percentile and worst client, and with few clients each client's own value (from the
    record's per-client columns, clients with test samples only, as the summaries); on
    next-token data the perplexity's, whose tail is the 90th percentile."""
    score, tail = (("perplexity", "p90") if "personal_perplexity_mean" in record
                   else ("accuracy", "p10"))
    keys = [f"personal_{score}_{s}" for s in ("mean", tail, "worst")]
    if not all(isinstance(record.get(k), (int, float)) for k in keys):
        return []
    mean, p10, worst = (record[k] for k in keys)
    parts = [f"personal mean {mean:.4f} {tail} {p10:.4f} worst {worst:.4f}"]
    columns = record.get(PER_CLIENT)
    if columns is not None:
        shown = (~columns["held_out"]) & (columns["samples"] > 0)
        clients, acc = columns["client"][shown], columns[f"personal_{score}"][shown]
        if 0 < len(clients) <= SHOWN_CLIENTS:
            parts.append("clients " + " ".join(f"{c}:{a:.2f}" for c, a in
                                               zip(clients.tolist(), acc.tolist(), strict=True)))
    return parts


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text).replace("{", "{{").replace("}", "}}")  # markup, then str.format


def bf16_hint(cfg: RunConfig, cpu: Cpu | None = None) -> str:
    """A warning for a run in bf16 on a CPU that multiplies bf16 only by emulation, where it
    is many times slower than float32; empty elsewhere (a GPU, a CPU with AMX or AVX-512-BF16,
    or features that could not be read). ``cpu`` defaults to this machine's."""
    from fedforge.core.machine import native_bf16
    from fedforge.engine.rounding import BF16_PRECISIONS
    from fedforge.experiment.build import resolve_device

    model = getattr(cfg, "model", None)  # a multi-task config has its models per task
    bf16 = (cfg.engine.precision in BF16_PRECISIONS
            or (getattr(model, "options", None) or {}).get("precision") == "bf16")
    if not bf16 or resolve_device(cfg.engine.device).type != "cpu":
        return ""
    if native_bf16(cpu) is not False:
        return ""
    return ("bf16 on a CPU without AMX or AVX-512-BF16: its matmuls are emulated, often many "
            "times slower than float32 (docs/speed.md)")
