"""Where the commands print, and the one-line error: an error of the user's input (not a
bug) leaves as ``error: <message>`` on stderr with exit code 2, never as a traceback."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import NoReturn

import typer
from rich.console import Console
from rich.table import Table

console = Console(soft_wrap=True)  # a path printed whole, also when piped (grep finds it)
err_console = Console(stderr=True)


def fail(message: str) -> NoReturn:
    """Print ``error: message`` (as text, never as markup) and exit with code 2."""
    from rich.markup import escape

    err_console.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code=2)


@contextmanager
def failing(*errors: type[Exception]) -> Iterator[None]:
    """An error of these types (the user's input, not a bug) leaves as one line."""
    try:
        yield
    except errors as exc:
        fail(str(exc))


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[str]], *,
                highlight: bool = False, bold_first: bool = False, **table_options) -> None:
    """A rich table of ``rows`` under ``title``; ``bold_first``: the first column in bold."""
    table = Table(title=title, **table_options)
    for i, column in enumerate(columns):
        table.add_column(column, style="bold" if bold_first and i == 0 else None)
    for row in rows:
        table.add_row(*row)
    print_wide(table, highlight=highlight)


def print_wide(renderable, **options) -> None:
    """Print ``renderable``; piped to a file (no terminal, so rich assumes 80 columns), at its
    natural width, so that a table's cells are not cut to ``fed…``."""
    if console.is_terminal:
        console.print(renderable, **options)
        return
    width = console.width
    natural = console.measure(renderable, options=console.options.update_width(10_000))
    console.width = max(width, natural.maximum)
    try:
        console.print(renderable, **options)
    finally:
        console.width = width


@contextmanager
def out_of_memory_fails() -> Iterator[None]:
    """A failed allocation (past a ``ulimit -v`` or a container's limit) leaves as one line
    too; any other ``MemoryError`` or ``RuntimeError`` is a bug and is raised."""
    from fedforge.core.memory import out_of_memory

    try:
        yield
    except (MemoryError, RuntimeError) as exc:
        if (message := out_of_memory(exc)) is None:
            raise
        fail(message)
