"""What the commands print when their output is not a terminal: the run folder on the
``done`` line whole, and a wide table at its natural width (a pipe has no width, and rich
used to wrap the path, and cut a comparison's cells to ``fed…``, at 80 columns)."""

from __future__ import annotations

import io

from typer.testing import CliRunner

from fedforge.cli import app
from fedforge.commands import output


def test_the_done_line_holds_the_whole_run_folder(tmp_path):
    out = tmp_path / ("a_long_folder_name_for_a_run_" * 4) / "quickstart"
    result = CliRunner().invoke(app, ["run", "examples/quickstart.toml", "rounds=1",
                                      "eval.every=1", "engine.name=loop", "--out", str(out),
                                      "-q"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    done = [line for line in result.output.splitlines() if line.startswith("done")]
    assert len(done) == 1 and str(out) in done[0], result.output


def test_a_wide_table_piped_to_a_file_keeps_every_cell_whole(monkeypatch):
    columns = [f"final personal accuracy column {i}" for i in range(6)]
    rows = [["fedavg_ft"] * 6, ["fedrep"] * 6]
    stream = io.StringIO()
    monkeypatch.setattr(output.console, "file", stream)
    output.print_table("comparison", columns, rows)
    text = stream.getvalue()
    assert "…" not in text and "fedavg_ft" in text
    assert all(c in text for c in columns)
    assert output.console.width == 80 or output.console.is_terminal  # put back as it was
