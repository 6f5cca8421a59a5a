"""``fedforge compare``: rounds / simulated time to a target, per-algorithm tables, seeds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedforge.cli import app
from fedforge.experiment.config import ConfigError
from fedforge.study.compare import (
    comparison_configs,
    format_cell,
    rounds_to_target,
    run_comparison,
    sim_time_to_target,
    summary,
)

REPO = Path(__file__).resolve().parents[2]
HIST = [{"round": 5, "test_accuracy": 0.2, "sim_time_s": 50.0},
        {"round": 10, "test_accuracy": 0.5, "sim_time_s": 100.0},
        {"round": 15, "test_accuracy": 0.4, "sim_time_s": 150.0}]


def test_rounds_and_sim_time_to_target():
    assert rounds_to_target(HIST, 0.5) == 10
    assert sim_time_to_target(HIST, 0.5) == 100.0
    assert rounds_to_target(HIST, 0.2) == 5
    assert rounds_to_target(HIST, 0.6) is None and sim_time_to_target(HIST, 0.6) is None
    assert sim_time_to_target([{"round": 1, "test_accuracy": 1.0}], 0.5) is None


def _config(tmp_path: Path) -> Path:
    text = (REPO / "examples" / "quickstart.toml").read_text()
    text += ("\n[compare.fedadam.algorithm]\nserver_lr = 0.003\n"
             "\n[compare.fedavg.client]\nbatch_size = 7\n")
    path = tmp_path / "cmp.toml"
    path.write_text(text)
    return path


def test_per_algorithm_tables_and_seeds(tmp_path):
    cfgs = comparison_configs(_config(tmp_path), ["fedadam", "fedavg"], ["rounds=2"], [3, 4])
    fedadam, fedavg = cfgs["fedadam"], cfgs["fedavg"]
    assert [c.seed for c in fedadam] == [3, 4]
    assert fedadam[0].algorithm.hparams == {"local_lr": 0.01, "server_lr": 0.003}
    assert fedadam[0].client.batch_size == 10 and fedavg[0].client.batch_size == 7
    assert fedavg[0].algorithm.hparams == {"local_lr": 0.01} and fedavg[0].rounds == 2
    assert fedavg[0].compare == {}  # the tables are consumed
    # command-line overrides win over the per-algorithm table
    (cfg,) = comparison_configs(_config(tmp_path), ["fedadam"], ["algorithm.server_lr=0.1"])[
        "fedadam"]
    assert cfg.algorithm.hparams["server_lr"] == 0.1


def test_bad_compare_table_names_the_field(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[compare]\nfedavg = 3\n')
    with pytest.raises(ConfigError, match=r"compare\.fedavg"):
        comparison_configs(path, ["fedavg"])
    path.write_text('[compare.fedavg.algorithm]\nbogus = 1\n')
    with pytest.raises(ConfigError, match="bogus"):
        comparison_configs(path, ["fedavg"])


def test_table_gives_rounds_and_sim_minutes_over_seeds(tmp_path):
    cfgs = comparison_configs(_config(tmp_path), ["fedavg"], [
        "rounds=2", "eval.every=1", "sim.step_time_s=30.0", "client.local_steps=2",
        "client.local_epochs=null"], [0, 1])
    rows, plot = run_comparison(cfgs, tmp_path / "out", target=0.0, progress=False)
    (row,) = rows
    # every round costs 2 steps x 30 s (+ microseconds of transfer): the target 0 is reached
    # at the first evaluation, round 1, i.e. 1 simulated minute
    assert row["seeds"] == 2
    assert row["rounds_to_0"] == {"mean": 1.0, "std": 0.0, "n": 2, "ci_low": 1.0,
                                  "ci_high": 1.0}
    assert row["sim_min_to_0"]["mean"] == pytest.approx(1.0, rel=1e-3)
    assert row["sim_s_per_round"]["mean"] == pytest.approx(60.0, rel=1e-3)
    assert (tmp_path / "out" / "fedavg" / "seed1" / "metrics.jsonl").is_file()
    assert json.loads((tmp_path / "out" / "table.json").read_text()) == rows
    assert plot.is_file() and (tmp_path / "out" / "accuracy_vs_sim_time.png").is_file()


def test_summary_and_cells():
    assert format_cell(summary([]), 2) == "not reached"
    assert summary([10.0]) == {"mean": 10.0, "std": None, "n": 1, "ci_low": None,
                               "ci_high": None}
    assert format_cell(summary([10.0]), 2) == "10 (1/2)"
    # 10, 20: sd 7.0711 (ddof 1), t_{0.975, 1} = 12.706 -> half width 12.706 * 7.0711 / √2
    two = summary([10.0, 20.0])
    assert two["std"] == pytest.approx(7.0711, abs=1e-4)
    assert two["ci_high"] - 15.0 == pytest.approx(63.53, abs=0.01)
    assert format_cell(two, 2) == "15 ± 64"


def test_cli_compare_target_and_seeds(tmp_path):
    res = CliRunner().invoke(app, [
        "compare", str(_config(tmp_path)), "-a", "fedavg,fedadam", "--target", "0.05",
        "--seeds", "0", "-q", "-o", str(tmp_path / "cli"), "rounds=2", "eval.every=1"])
    assert res.exit_code == 0, res.output
    rows = json.loads((tmp_path / "cli" / "table.json").read_text())
    assert [r["algorithm"] for r in rows] == ["fedavg", "fedadam"]
    assert {"rounds_to_0.05", "sim_min_to_0.05"} <= set(rows[0])
    res = CliRunner().invoke(app, ["compare", str(_config(tmp_path)), "-a", "fedavg",
                                   "--seeds", "a,b", "-o", str(tmp_path / "x")])
    assert res.exit_code == 2 and "--seeds" in res.output


VARIANTS = """
[compare.fedavg_lo.algorithm]
name = "fedavg"
local_lr = 0.01

[compare.fedavg_hi.algorithm]
name = "fedavg"
local_lr = 0.5
"""


def test_named_variants_compare_one_algorithm_at_two_settings(tmp_path):
    config = tmp_path / "variants.toml"
    config.write_text((REPO / "examples" / "quickstart.toml").read_text() + VARIANTS)
    cfgs = comparison_configs(config, ["fedavg_lo", "fedavg_hi", "fedprox"])
    assert {n: (c[0].algorithm.name, c[0].algorithm.model_extra.get("local_lr"))
            for n, c in cfgs.items()} == {"fedavg_lo": ("fedavg", 0.01),
                                          "fedavg_hi": ("fedavg", 0.5),
                                          "fedprox": ("fedprox", 0.01)}
    result = CliRunner().invoke(app, ["compare", str(config), "-a", "fedavg_lo,fedavg_hi",
                                      "rounds=1", "--out", str(tmp_path / "c"), "-q"])
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "c" / "table.json").read_text())
    assert [r["algorithm"] for r in rows] == ["fedavg_lo", "fedavg_hi"]
    assert rows[0]["final_acc"]["mean"] != rows[1]["final_acc"]["mean"]


def test_a_variant_whose_algorithm_name_is_not_a_string_is_one_line(tmp_path):
    config = tmp_path / "variants.toml"
    config.write_text((REPO / "examples" / "quickstart.toml").read_text()
                      + "\n[compare.x.algorithm]\nname = 3\n")
    with pytest.raises(ConfigError, match=r"compare\.x\.algorithm\.name"):
        comparison_configs(config, ["x"])
