"""A finished quickstart run that several reliability files copy and then attack."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedforge import cli

QUICK = str(Path("examples/quickstart.toml").resolve())
SHORT = ["rounds=2", "eval.every=1", "checkpoint.every=2", "eval.per_client=false"]


@pytest.fixture(scope="module")
def quickstart_run(tmp_path_factory) -> Path:
    """A two-round quickstart run folder, its lock file removed; copy it before changing it."""
    out = tmp_path_factory.mktemp("base") / "run"
    result = CliRunner().invoke(cli.app, ["run", QUICK, *SHORT, "-q", "--out", str(out)])
    assert result.exit_code == 0, result.output
    (out / "run.lock").unlink(missing_ok=True)
    return out
