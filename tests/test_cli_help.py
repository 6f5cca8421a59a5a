"""Every ``--help`` shows the brackets its text names: rich reads ``[sweep]`` as markup and
drops it unless escaped (``\\[sweep]``), so a help text that names a config section or a
``[[tasks]]`` list must escape it."""

from __future__ import annotations

import re

import click
import pytest
import typer
from typer.testing import CliRunner

from fedforge.cli import app

ROOT = typer.main.get_command(app)
_BRACKETED = re.compile(r"\\?\[\[?[A-Za-z_][\w.*]*\]\]?")


def _commands(group: click.Group, path: tuple[str, ...] = ()):
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))


def _texts(command: click.Command) -> list[str]:
    texts = [command.help or ""]
    texts += [getattr(p, "help", None) or "" for p in command.params]
    return texts


COMMANDS = list(_commands(ROOT))


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=" ".join)
def test_help_keeps_every_bracketed_name(path):
    command = dict(COMMANDS)[path]
    wanted = {m.group().lstrip("\\") for t in _texts(command) for m in _BRACKETED.finditer(t)}
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "400"},
                                terminal_width=400)
    assert result.exit_code == 0, result.output
    shown = " ".join(result.output.split())
    missing = sorted(w for w in wanted if w not in shown)
    assert not missing, f"fedforge {' '.join(path)} --help drops {missing}"
