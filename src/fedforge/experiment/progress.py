"""What a run shows while it trains, and its optional TensorBoard log.

In a terminal: a rich progress bar naming the algorithm, seed and round, with the latest
accuracy (``compare`` adds which run of how many it is). Without a terminal (output
redirected to a file, a batch job): one plain line per evaluation, flushed at once, so the
log follows the run. With ``logging.tensorboard = true`` every record (one per round, the
test metrics on evaluated rounds) is also written as TensorBoard scalars to
``<run>/tensorboard/`` through ``torch.utils.tensorboard``
(``pip install 'fedforge[tensorboard]'``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from fedforge.experiment.metrics import is_evaluated

if TYPE_CHECKING:
    from fedforge.experiment.config import RunConfig

_POSITION: ContextVar[str] = ContextVar("fedforge_run_position", default="")


@contextmanager
def run_position(text: str) -> Iterator[None]:
    """Runs started inside show ``text`` (e.g. ``run 2/6``) in their progress."""
    token = _POSITION.set(text)
    try:
        yield
    finally:
        _POSITION.reset(token)


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
    """

    def __init__(self, rounds: int, start: int = 1, enabled: bool = True, label: str = "",
                 stream: TextIO | None = None, tensorboard: Path | None = None) -> None:
        self.enabled = enabled
        self.rounds, self.start = rounds, start
        position = _POSITION.get()
        self.label = " ".join(p for p in (label, f"[{position}]" if position else "") if p)
        self.stream = stream if stream is not None else sys.stdout
        self.lines = enabled and not _is_terminal(self.stream)
        self._tb_dir = tensorboard
        self.intro = ""  # a line shown at the start (the partition's client sizes)
        self._tb = None
        desc = f"[bold]{_escape(self.label)}[/bold] " if self.label else ""
        self._progress = Progress(
            TextColumn(desc + "round {task.completed}/{task.total}"), BarColumn(),
            TextColumn("{task.fields[status]}"), TimeElapsedColumn(), TimeRemainingColumn(),
            console=Console(file=self.stream), disable=not enabled or self.lines,
        )

    @classmethod
    def for_run(cls, cfg: RunConfig, out: Path, start: int = 1,
                enabled: bool = True) -> RoundProgress:
        """The progress of a run of ``cfg`` writing into ``out`` (its TensorBoard folder)."""
        from fedforge.experiment.partition_stats import load_partition_stats, partition_summary

        tb = out / "tensorboard" if cfg.logging.tensorboard else None
        bar = cls(cfg.rounds, start, enabled, label=f"{cfg.algorithm.name} seed {cfg.seed}",
                  tensorboard=tb)
        stats = load_partition_stats(out)  # written just before, at the run's start
        if stats is not None:
            bar.intro = f"{stats['dataset']}: {partition_summary(stats)}"
        return bar

    def __enter__(self) -> RoundProgress:
        if self._tb_dir is not None:
            self._tb = _summary_writer(self._tb_dir, self.start)
        self._progress.__enter__()
        self._task = self._progress.add_task("rounds", total=self.rounds,
                                             completed=self.start - 1, status="")
        if self.lines:
            self._line(f"rounds {self.start}-{self.rounds}"
                       + (f"; {self.intro}" if self.intro else ""))
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
            if self._tb is not None:
                for key, value in record.items():
                    if isinstance(value, (int, float)) and not isinstance(value, bool) \
                            and key != "round":
                        self._tb.add_scalar(key, value, global_step=round_)
                self._tb.flush()
        self._progress.update(self._task, completed=round_, **fields)

    def _line(self, text: str) -> None:
        print(f"{self.label}: {text}" if self.label else text, file=self.stream, flush=True)

    def __exit__(self, *exc) -> None:
        self._progress.__exit__(*exc)
        if self._tb is not None:
            self._tb.close()


def _status(record: dict) -> str:
    parts = [f"{k.removeprefix('test_')} {record[k]:.4f}" for k in ("test_accuracy", "test_loss")
             if isinstance(record.get(k), (int, float))]
    return " ".join(parts)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text).replace("{", "{{").replace("}", "}}")  # markup, then str.format


def _summary_writer(folder: Path, start: int):
    """TensorBoard's own writer; a resumed run drops the events after its checkpoint."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:  # torch imports tensorboard lazily, here
        raise ImportError("logging.tensorboard: needs the tensorboard package "
                          "(pip install 'fedforge[tensorboard]')") from exc
    return SummaryWriter(log_dir=str(folder), purge_step=start if start > 1 else None)
