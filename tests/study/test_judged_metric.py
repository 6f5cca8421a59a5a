"""The metric a method is judged by: compare ranks on it and shows the pooled test accuracy
beside it, the per-client file holds the rows the summaries are taken over, a client's
personal model is the one evaluated, and figures cut bands to the metric's declared range
and keep a method's colour in every figure."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fedforge.algorithms import build_algorithm
from fedforge.engine.client_eval import client_accuracy
from fedforge.experiment.client_metrics import (
    ClientMetricsFile,
    last_round,
    load_client_metrics,
    worst_share_mean,
)
from fedforge.experiment.config import load_config
from fedforge.experiment.metrics import PER_CLIENT, MetricsWriter
from fedforge.experiment.runner import Experiment, run_experiment
from fedforge.study.client_plots import client_spreads, ecdf_figure
from fedforge.study.compare import comparison_configs, run_comparison
from fedforge.study.judged import comparison_metric
from fedforge.study.labels import metric
from fedforge.study.plots import draw, load_run_list

REPO = Path(__file__).resolve().parents[2]
QUICK = REPO / "examples" / "quickstart.toml"
TINY = ["rounds=2", "eval.every=1", "client.local_steps=1", "client.local_epochs=null",
        "checkpoint.every=1", "engine.name=loop", "eval.personal=true"]


def test_each_algorithm_declares_what_it_is_judged_by():
    assert build_algorithm("fedavg").judged_by == "test_accuracy"
    for name in ("fedavg_ft", "ditto", "fedrep"):
        assert build_algorithm(name).judged_by == "personal_accuracy_mean"
    from dataclasses import replace  # a fairness method names its own
    assert replace(build_algorithm("fedavg"),
                   primary_metric="global_accuracy_worst").judged_by == "global_accuracy_worst"


def test_compare_ranks_on_the_personal_metric_and_shows_both_columns(tmp_path):
    cfgs = comparison_configs(QUICK, ["fedavg", "fedavg_ft", "ditto"], TINY)
    rows, plot = run_comparison(cfgs, tmp_path / "cmp", progress=False)
    assert [r["algorithm"] for r in rows] == ["fedavg", "fedavg_ft", "ditto"]  # the -a order
    personal = {r["algorithm"]: r["final_personal_accuracy_mean"]["mean"] for r in rows}
    pooled = {r["algorithm"]: r["final_acc"]["mean"] for r in rows}
    assert len(set(personal.values())) == 3
    best_first = sorted(personal, key=personal.get, reverse=True)
    assert {r["algorithm"]: r["rank_by_personal_accuracy_mean"] for r in rows} == {
        name: i + 1 for i, name in enumerate(best_first)}
    assert best_first[-1] == "fedavg" and len(set(pooled.values())) == 1  # one global model
    # differences to the first method, paired by client (one seed)
    assert rows[0]["paired_by"] == "reference" and rows[0]["vs_fedavg"] is None
    for row in rows[1:]:
        assert row["paired_by"] == "client (30 pairs)"
        assert row["vs_fedavg"]["mean"] == pytest.approx(
            personal[row["algorithm"]] - personal["fedavg"])
    drawn = json.loads(plot.with_suffix(".json").read_text())
    assert drawn["y"] == "personal_accuracy_mean"
    assert [c["method"] for c in drawn["curves"]] == ["fedavg", "fedavg_ft", "ditto"]
    assert metric("final_acc").source == "global model, pooled test set"
    assert "personalised model" in metric("final_personal_accuracy_mean").described


def _recomputed(acc: np.ndarray, n: np.ndarray, prefix: str) -> dict[str, float]:
    return {f"{prefix}_mean": acc.mean(), f"{prefix}_weighted": (acc * n).sum() / n.sum(),
            f"{prefix}_p10": np.percentile(acc, 10), f"{prefix}_worst": acc.min(),
            f"{prefix}_var": acc.var()}


def test_the_per_client_file_holds_the_rows_of_the_summaries(tmp_path):
    cfg = load_config(QUICK, [*TINY, "algorithm.name=fedavg_ft", "algorithm.finetune_steps=2",
                              "eval.held_out=4", "eval.finetune_steps=3"])
    records = run_experiment(cfg, tmp_path / "run", progress=False)
    cols = load_client_metrics(tmp_path / "run")
    assert sorted(set(cols["round"].tolist())) == [1, 2]
    for rec in records:
        mine = cols["round"] == rec["round"]
        assert sorted(cols["client"][mine].tolist()) == list(range(30))
        for held, tag in ((False, ""), (True, "held_out_")):
            rows = mine & (cols["held_out"] == held) & (cols["samples"] > 0)
            n = cols["samples"][rows].astype(float)
            for column in ("personal", "global"):
                want = _recomputed(cols[f"{column}_accuracy"][rows], n,
                                   f"{tag}{column}_accuracy")
                assert {k: rec[k] for k in want} == pytest.approx(want, abs=1e-12)
    assert np.isfinite(cols["personal_loss"]).all() and (cols["global_loss"] > 0).all()
    last = last_round(cols)["personal_accuracy"]
    k = int(np.ceil(0.1 * len(last)))  # the worst 10 %, at least one client
    assert worst_share_mean(last) == pytest.approx(np.sort(last)[:k].mean())
    assert worst_share_mean(last) < last.mean()


def test_a_resumed_log_keeps_the_per_client_rows_of_the_rounds_it_keeps(tmp_path):
    clients = tmp_path / "client_metrics.npz"
    writer = MetricsWriter(tmp_path / "metrics.jsonl", clients=clients)
    for r in (1, 2, 3):
        columns = {"client": np.arange(2), "held_out": np.zeros(2, bool),
                   "samples": np.full(2, 5), "personal_accuracy": np.full(2, r / 10),
                   "personal_loss": np.ones(2), "global_accuracy": np.zeros(2),
                   "global_loss": np.ones(2)}
        writer.write({"round": r, "test_accuracy": 0.5, PER_CLIENT: columns})
    assert PER_CLIENT not in (tmp_path / "metrics.jsonl").read_text()
    MetricsWriter(tmp_path / "metrics.jsonl", truncate_after=2, clients=clients)
    assert load_client_metrics(tmp_path)["round"].tolist() == [1, 1, 2, 2]
    ClientMetricsFile(clients)  # a fresh run starts without the old rows
    assert not clients.exists()


@pytest.mark.parametrize("name", ["ditto", "fedavg_ft"])
def test_a_clients_personal_model_is_the_model_evaluated(tmp_path, name):
    extra = ["algorithm.finetune_steps=2"] if name == "fedavg_ft" else []
    cfg = load_config(QUICK, [*TINY, f"algorithm.name={name}", *extra])
    exp = Experiment.from_config(cfg, tmp_path / name)
    exp.run()
    rows = last_round(load_client_metrics(tmp_path / name))
    tests = exp.client_tests
    for client in (0, 13, 29):
        net = exp.personal_model(client)
        params = dict(net.state_dict())
        acc, _ = client_accuracy(net, params, tests.x, tests.y, [tests.indices[client]],
                                 stacked=False)
        assert float(acc[0]) == pytest.approx(
            float(rows["personal_accuracy"][rows["client"] == client][0]), abs=1e-12)
    own = exp.personal_model(0).state_dict()
    assert any(not torch.equal(v, exp.model().state_dict()[k]) for k, v in own.items())


# --- figures ---------------------------------------------------------------------------

def _run_folder(path: Path, algorithm: str, seed: int, values: dict[str, list[float]]) -> Path:
    path.mkdir(parents=True)
    rounds = len(next(iter(values.values())))
    lines = [json.dumps({"round": t + 1, **{k: v[t] for k, v in values.items()}})
             for t in range(rounds)]
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (path / "config.resolved.toml").write_text(
        f'seed = {seed}\n[algorithm]\nname = "{algorithm}"\n[data]\ndataset = "synthetic"\n')
    return path


def _band_range(fig) -> tuple[float, float]:
    ys = np.concatenate([p.vertices[:, 1] for c in fig.axes[0].collections
                         for p in c.get_paths()])
    return float(ys.min()), float(ys.max())


def test_bands_are_cut_to_the_range_each_metric_declares(tmp_path):
    seeds = {"personal_accuracy_mean": [[0.99, 0.98], [0.6, 0.97], [0.98, 0.99]],
             "test_loss": [[0.01, 0.02], [0.9, 0.03], [0.02, 0.01]],
             "my_score": [[0.01, 0.02], [0.9, 0.03], [0.02, 0.01]]}
    dirs = [_run_folder(tmp_path / f"s{s}", "ditto", s,
                        {k: v[s] for k, v in seeds.items()}) for s in range(3)]
    runs = load_run_list(dirs)
    assert metric("personal_accuracy_mean").bounds == (0.0, 1.0)
    assert metric("test_loss").bounds == (0.0, None) and metric("my_score").bounds is None
    for key, low, high in (("personal_accuracy_mean", None, 1.0), ("test_loss", 0.0, None),
                           ("my_score", None, None)):
        fig, data = draw(runs, key)
        lo, hi = _band_range(fig)
        whole = data["curves"][0]
        if low is not None:
            assert min(whole["ci_low"]) < low and lo == low  # the JSON keeps it whole
        if high is not None:
            assert max(whole["ci_high"]) > high and hi == high
        if low is None and high is None:
            assert lo == pytest.approx(min(whole["ci_low"]))


def test_a_method_keeps_its_colour_in_every_figure(tmp_path):
    def run(name: str, seed: int = 0) -> Path:
        return _run_folder(tmp_path / f"{name}{seed}", name, seed,
                           {"personal_accuracy_mean": [0.2, 0.3], "test_accuracy": [0.1, 0.2]})

    def colours(fig) -> dict[str, str]:
        return {ln.get_label().split(" ")[0]: ln.get_color()
                for ax in fig.axes for ln in ax.get_lines() if not ln.get_label().startswith("_")}

    one = load_run_list([run("fedavg"), run("ditto")])
    two = load_run_list([run("fedrep"), run("ditto", 1), run("fedavg_ft")])
    seen = [colours(draw(one)[0]), colours(draw(two)[0]),
            colours(draw(two, "test_accuracy", bands="panels")[0])]
    for folder in (tmp_path / "ditto0", tmp_path / "fedrep0"):
        np.savez(folder / "client_metrics.npz", round=np.ones(3, int), client=np.arange(3),
                 held_out=np.zeros(3, bool), samples=np.full(3, 4),
                 personal_accuracy=np.array([0.2, 0.5, 0.9]), personal_loss=np.ones(3),
                 global_accuracy=np.zeros(3), global_loss=np.ones(3))
    spreads = client_spreads(load_run_list([tmp_path / "fedrep0", tmp_path / "ditto0"]),
                             "personal_accuracy")
    fig = ecdf_figure(spreads, "personal_accuracy", None)
    seen.append({ln.get_label(): ln.get_color() for ln in fig.axes[0].get_lines()
                 if not ln.get_label().startswith("_")})
    ditto = {s["ditto"] for s in seen}
    assert len(ditto) == 1 and seen[1]["fedrep"] == seen[3]["fedrep"]
    assert seen[0]["fedavg"] != seen[0]["ditto"]
    assert comparison_metric(one) == "personal_accuracy_mean"


def test_paired_differences_by_seed_and_the_choice_of_pairing():
    from fedforge.study.paired import as_pairs, choose_pairing, difference, seed_scores

    hists = {"a": [[{"round": 1, "test_accuracy": 0.5, "m": 0.50}],
                   [{"round": 1, "test_accuracy": 0.5, "m": 0.70}]],
             "b": [[{"round": 1, "test_accuracy": 0.5, "m": 0.60}],
                   [{"round": 1, "test_accuracy": 0.5, "m": 0.90}]]}
    got = difference(as_pairs(seed_scores(hists["b"], "m")), as_pairs(seed_scores(hists["a"], "m")))
    # seed by seed: 0.1 and 0.2, mean 0.15, sd 0.0707, t(0.975, 1) = 12.706
    assert got.n == 2 and got.mean == pytest.approx(0.15)
    assert got.half == pytest.approx(12.7062 * 0.0707107 / np.sqrt(2), rel=1e-4)
    assert choose_pairing("auto", 2, True) == "seed" and choose_pairing("auto", 1, True) == "client"
    assert choose_pairing("auto", 1, False) is None
    with pytest.raises(ValueError, match="--paired client: needs per-client results"):
        choose_pairing("client", 1, False)
    with pytest.raises(ValueError, match="--paired: expected one of"):
        choose_pairing("clients", 1, True)
