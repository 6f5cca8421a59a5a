"""docs/architecture.md's layout names every `fedforge` command, and no command that is gone."""

from __future__ import annotations

import re
from pathlib import Path

import typer.main

from fedforge.cli import app

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def doc_commands(text: str) -> set[str]:
    """The commands of the ``cli.py`` entry of the layout: ```fedforge a | b | ...```."""
    entry = text.split("\n  cli.py ", 1)[1].split("`fedforge ", 1)[1].split("`", 1)[0]
    return {name.strip() for name in re.split(r"\|", entry)}


def test_the_layout_lists_every_command():
    commands = set(typer.main.get_command(app).commands)
    assert doc_commands(DOC.read_text(encoding="utf-8")) == commands
    assert doc_commands("\n  cli.py  `fedforge run | plot`") == {"run", "plot"}
