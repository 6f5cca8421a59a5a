"""The accuracy-vs-ε table from run folders (hand-made metrics files)."""

from __future__ import annotations

import json
import math

import pytest

from fedforge.study.privacy_plots import (
    accuracy_table,
    plot_accuracy_vs_epsilon,
    table_markdown,
)


def _run(path, acc, eps, rounds=10):
    path.mkdir(parents=True)
    recs = [{"round": 5, "test_accuracy": 0.1}, {"round": rounds, "test_accuracy": acc,
                                                  **({} if eps is None else {"dp_epsilon": eps})}]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_table_means_stds_and_spent_epsilon(tmp_path):
    runs = {4.0: [_run(tmp_path / "a", 0.8, 3.9), _run(tmp_path / "b", 0.9, 3.95)],
            math.inf: [_run(tmp_path / "c", 0.95, None)]}
    rows = accuracy_table(runs)
    assert rows[0]["test_accuracy"] == pytest.approx(0.85)
    assert rows[0]["test_accuracy_std"] == pytest.approx(math.sqrt(0.005))  # sample std
    assert rows[0]["epsilon"] == 3.95
    assert rows[1]["epsilon"] == math.inf and rows[1]["test_accuracy_std"] == 0.0
    text = table_markdown(rows)
    assert "| 4 | 3.95 | 10 | 0.8500 ± 0.0707 | 2 |" in text
    assert plot_accuracy_vs_epsilon(rows, tmp_path / "p.png").stat().st_size > 0


def test_compare_draws_accuracy_against_spent_epsilon(tmp_path):
    """A private comparison also writes the accuracy-against-ε figure, whose x values are
    the ε each run had spent at its evaluations."""
    from pathlib import Path

    from fedforge.study.compare import comparison_configs, run_comparison

    root = Path(__file__).resolve().parents[2]

    cfgs = comparison_configs(
        root / "examples" / "quickstart.toml", ["fedavg"],
        ["rounds=2", "eval.every=1", "privacy.mode=central", "privacy.clip=1.0",
         "privacy.noise_multiplier=1.0"], None)
    run_comparison(cfgs, tmp_path, progress=False)
    figure = tmp_path / "accuracy_vs_dp_epsilon.png"
    assert figure.is_file() and figure.with_suffix(".pdf").is_file()
    records = [json.loads(x) for x in (tmp_path / "fedavg" / "metrics.jsonl").read_text()
               .splitlines() if x.strip()]
    eps = [r["dp_epsilon"] for r in records if "dp_epsilon" in r]
    assert len(eps) == 2 and 0 < eps[0] < eps[1]
