"""The baselines reproduction: its grid builds as the papers' settings ask, the fairness
metric is read from the per-client summaries, and Oort's censored times get the sign test."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedforge.reproduce import get_reproduction
from fedforge.reproduce.grid import grid_plan
from fedforge.reproduce.report import RunSummary, summarize
from fedforge.reproduce.verdicts import judge

ROOT = Path(__file__).resolve().parents[2]


def _configs():
    spec = get_reproduction("baselines")
    return spec, {(c.name, cfg.seed): cfg for c, cfg, _ in
                  grid_plan(spec, ROOT, Path("/nonexistent"))}


def test_the_grid_builds_each_paper_s_setting():
    spec, cfgs = _configs()
    assert len(cfgs) == len(spec.conditions) * len(spec.seeds)
    moon, fedavg = cfgs["moon", 0], cfgs["moon_fedavg", 3]
    assert moon.algorithm.name == "moon" and moon.data.partition_options == {"alpha": 0.5}
    assert moon.rounds == 20 and moon.data.options["max_train"] == 20000
    assert fedavg.algorithm.hparams["client_optimizer"] == "momentum"  # the paper's SGD
    assert cfgs["moon_fedprox", 0].algorithm.name == "fedprox"
    q0, q1 = cfgs["qffl_q0", 1], cfgs["qffl_q1", 1]
    assert (q0.algorithm.hparams["q"], q1.algorithm.hparams["q"]) == (0.0, 1.0)
    assert q0.eval.personal and q0.data.dataset == "synthetic"
    oort, uniform = cfgs["oort", 2], cfgs["oort_uniform", 2]
    assert (oort.server.sampler, uniform.server.sampler) == ("oort", "uniform")
    assert oort.sim.stragglers and oort.rounds == uniform.rounds == 300


def test_the_fairness_metrics_average_the_last_five_evaluations():
    """Six evaluations of the variance 0.1 .. 0.6: the last five average to 0.4 (all six:
    0.35); a round without the key is not an evaluation."""
    history = [{"round": r, "test_accuracy": 0.5, "global_accuracy_var": r / 10,
                "global_accuracy_mean": 0.6, "global_accuracy_p10": 0.2} for r in range(1, 7)]
    history.insert(3, {"round": 3.5, "train_loss": 1.0})
    run = summarize(history, 0, 0.5, "test_accuracy")
    assert run.final_client_var == pytest.approx(0.4)
    assert (run.final_client_mean, run.final_client_p10) == pytest.approx((0.6, 0.2))


def test_oort_time_to_accuracy_is_judged_as_censored():
    """Uniform sampling never reaches 0.5 in seed 2 (its time, 2800 s, is only a bound):
    the Oort row uses the exact sign test on 3 ordered pairs of 3, not a t-test."""
    spec = get_reproduction("baselines")

    def run(seed: int, t: float, reached: bool) -> RunSummary:
        return RunSummary(seed, 100.0, t, 0.5, reached, 1.0, [])

    runs = {"oort": {s: run(s, t, True) for s, t in enumerate((300.0, 320.0, 140.0))},
            "oort_uniform": {0: run(0, 410.0, True), 1: run(1, 390.0, True),
                             2: run(2, 2800.0, False)}}
    row = next(j for j in judge(spec, runs)
               if (j.comp.a, j.comp.b, j.comp.metric) == ("oort", "oort_uniform", "sim_time"))
    assert row.test == "exact sign test" and row.signs == (3, 0, 0)
    assert row.p == pytest.approx(0.25) and row.family == "primary"
    assert "uniform sampling ≥ 2.8e+03 in 1 of 3 seeds" in row.censored


def test_a_primary_claim_with_one_seed_asks_for_the_minimum():
    """One seed has no spread, so the power rule cannot size the claim; a primary claim
    still needs at least 5 seeds, so the page calls it underpowered and the command asks
    for them (before: "1 / ?", and no command)."""
    spec = get_reproduction("baselines")

    def run(acc: float) -> dict[int, RunSummary]:
        return {0: RunSummary(0, 20.0, 1.0, acc, True, 1.0, [])}

    runs = {"moon": run(0.32), "moon_fedavg": run(0.45), "moon_fedprox": run(0.45)}
    rows = [j for j in judge(spec, runs) if j.comp.a == "moon"]
    assert [(j.needed, j.underpowered) for j in rows] == [(5, True), (5, True)]
    fedprox = next(j for j in judge(spec, runs) if j.comp.a == "moon_fedprox")
    assert (fedprox.needed, fedprox.family) == (2, "exploratory")


def test_the_diagnostics_figure_draws_only_what_a_setting_logs():
    """MOON logs no diagnostic, so its row is left out; q-FFL logs the variance but not
    Oort's keys, so its row has the claim's metric and the variance only."""
    from fedforge.reproduce.report import _diagnostic_rows

    spec = get_reproduction("baselines")

    def run(extra: dict) -> dict[int, RunSummary]:
        history = [{"round": r, "test_accuracy": 0.1 * r, **extra} for r in (1, 2)]
        return {0: RunSummary(0, 2.0, 2.0, 0.2, True, 1.0, history)}

    runs = {"moon": run({}), "moon_fedavg": run({}), "qffl_q1": run({"global_accuracy_var": 0.1}),
            "oort": run({"oort_exploration": 0.5})}
    keys = ["test_accuracy", *spec.diagnostics]
    rows = {title.split(":")[0]: (names, logged)
            for title, names, logged in _diagnostic_rows(spec, runs, keys)}
    assert set(rows) == {"q-FFL", "Oort"}
    assert rows["q-FFL"] == (["qffl_q1"], ["test_accuracy", "global_accuracy_var"])
    assert rows["Oort"] == (["oort"], ["test_accuracy", "oort_exploration"])
