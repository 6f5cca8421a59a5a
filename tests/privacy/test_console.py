"""A private run shows what it spent where its accuracy is shown: the final line and the
``compare`` table carry ε and σ."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("dp_accounting", reason="needs the privacy extra (dp-accounting)")

from fedforge.cli import app  # noqa: E402

QUICK = Path(__file__).resolve().parents[2] / "examples" / "quickstart.toml"
PRIVATE = ["data.options.num_clients=12", "server.clients_per_round=4", "client.batch_size=8",
           "privacy.mode=central", "privacy.noise_multiplier=2.0", "rounds=2"]


def _invoke(*args: str) -> str:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.output


def test_final_line_gives_epsilon_and_sigma(tmp_path):
    out = _invoke("run", str(QUICK), *PRIVATE, "--out", str(tmp_path / "r"), "-q")
    last = json.loads((tmp_path / "r" / "metrics.jsonl").read_text().splitlines()[-1])
    final = " ".join(out[out.index("done "):].split())  # the console may wrap the line
    assert f"ε={last['dp_epsilon']:.3f} σ=2 " in final


def test_a_run_without_privacy_says_nothing_of_it(tmp_path):
    out = _invoke("run", str(QUICK), *PRIVATE[:3], "rounds=1", "--out", str(tmp_path / "r"),
                  "-q")
    assert "ε=" not in out and "σ=" not in out


def test_compare_table_gives_epsilon_and_sigma(tmp_path):
    _invoke("compare", str(QUICK), *PRIVATE, "-a", "fedavg", "--out", str(tmp_path / "c"), "-q")
    (row,) = json.loads((tmp_path / "c" / "table.json").read_text())
    assert row["dp_noise_multiplier"]["mean"] == 2.0
    assert row["dp_epsilon"]["mean"] > 0
