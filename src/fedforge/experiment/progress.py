"""A rich progress bar over rounds that shows the latest accuracy (silent when disabled)."""

from __future__ import annotations

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class RoundProgress:
    def __init__(self, rounds: int, start: int = 1, enabled: bool = True) -> None:
        self.enabled = enabled
        self.rounds, self.start = rounds, start
        self._progress = Progress(
            TextColumn("[bold]round {task.completed}/{task.total}"), BarColumn(),
            TextColumn("{task.fields[status]}"), TimeElapsedColumn(), TimeRemainingColumn(),
            disable=not enabled,
        )

    def __enter__(self) -> RoundProgress:
        self._progress.__enter__()
        self._task = self._progress.add_task("rounds", total=self.rounds,
                                             completed=self.start - 1, status="")
        return self

    def advance(self, round_: int, record: dict | None) -> None:
        fields = {}
        if record is not None:
            fields["status"] = (f"acc {record['test_accuracy']:.4f} "
                                f"loss {record['test_loss']:.4f}")
        self._progress.update(self._task, completed=round_, **fields)

    def __exit__(self, *exc) -> None:
        self._progress.__exit__(*exc)
