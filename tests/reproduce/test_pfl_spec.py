"""The personalised-FL reproduction: every method on the same per-client splits, the claim's
family named in the spec, and the mean per-client accuracy the report judges."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fedforge.algorithms import ALGORITHMS
from fedforge.reproduce import REPRODUCTIONS, get_reproduction, papers
from fedforge.reproduce.grid import grid_plan
from fedforge.reproduce.papers import pfl
from fedforge.reproduce.report import RunSummary, condition_table, judge, summarize

ROOT = Path(__file__).resolve().parents[2]
assert papers  # importing it registers every built-in reproduction


def _plan():
    spec = get_reproduction("pfl")
    return spec, {(c.name, cfg.seed): cfg for c, cfg, _ in grid_plan(spec, ROOT, Path("runs"))}


@pytest.mark.parametrize("name", sorted(REPRODUCTIONS))
def test_every_reproduction_runs_registered_algorithms(name):
    """Each condition of every registered single-task spec names an algorithm of the
    registry, and its grid plan loads: one config per condition and seed."""
    spec = get_reproduction(name)
    if not spec.multitask:  # a multi-task condition names the method, not an algorithm
        assert {c.algorithm for c in spec.conditions} <= set(ALGORITHMS)
    plan = grid_plan(spec, ROOT, Path("runs"))
    assert len(plan) == len(spec.conditions) * len(spec.seeds)


def test_the_grid_is_every_registered_method_in_four_settings_with_three_seeds():
    spec, plan = _plan()
    methods = [m for m in pfl.METHODS if m[1] in ALGORITHMS]
    assert {"fedavg", "fedavg_ft", "local", "ditto", "fedrep", "fedbabu", "fedper"} <= {
        m[0] for m in methods}
    assert spec.seeds == (0, 1, 2)
    assert len(plan) == 4 * (len(methods) + 1) * 3  # + FedBABU with its authors' fine-tuning
    for (name, seed), cfg in plan.items():
        assert cfg.algorithm.name == spec.condition(name).algorithm
        assert cfg.seed == seed and cfg.data.num_clients == 20
        assert cfg.server.clients_per_round == 20  # every client in every round
        assert cfg.data.client_test_fraction == 0.25 and cfg.eval.personal is True
        dataset = "cifar10" if name.startswith("c10") else "femnist"
        assert cfg.data.dataset == dataset
        if "_dir_" in name:
            assert (cfg.data.partition, cfg.data.partition_options) == ("dirichlet",
                                                                        {"alpha": 0.1})
        else:
            assert (cfg.data.partition, cfg.data.partition_options) == (
                "shards", {"classes_per_client": 2})


def test_methods_of_a_setting_differ_only_in_the_algorithm():
    """Paired seeds: the same seed gives every method of a setting the same data, partition,
    per-client split, model, local work and rounds."""
    spec, plan = _plan()
    for prefix, *_ in pfl.SETTINGS:
        for seed in spec.seeds:
            dumps = []
            for c in spec.conditions:
                if c.name.startswith(prefix + "_"):
                    d = plan[(c.name, seed)].model_dump()
                    d.pop("algorithm")
                    dumps.append(d)
            assert len(dumps) > 1 and all(d == dumps[0] for d in dumps)


def test_the_primary_family_is_personalised_against_fedavg_ft_and_local_only():
    spec = get_reproduction("pfl")
    primary = [c for c in spec.comparisons if c.primary]
    assert len(primary) == 24
    assert {(c.a, c.b) for c in primary} == {
        (f"{p}_{a}", f"{p}_{b}") for p, *_ in pfl.SETTINGS for a in ("ditto", "fedrep")
        for b in ("fedavg", "fedavg_ft", "local")}
    for c in spec.comparisons:
        assert c.metric == "final_personal_acc" and (c.expect == ">" or c.kind == "equivalence")
        assert c.a.split("_")[:2] == c.b.split("_")[:2]  # within one setting
    close = [c for c in spec.comparisons if c.kind == "equivalence"]
    assert [(c.a.split("_", 2)[2], c.b.split("_", 2)[2], c.margin) for c in close] == [
        ("fedavg_ft", "fedrep", 0.02)] * 4 and not any(c.primary for c in close)


def test_pfllib_ties_are_no_claim_and_fedbabu_is_fine_tuned_as_its_authors_do():
    """PFLlib's pathological FMNIST column has FedBABU and APFL both at 99.41: that pair is
    no claim (never "contradicted"); FedRep 99.56 ± 0.03 over Ditto 99.44 ± 0.06 is one.
    The ranking uses FedBABU at its authors' fine-tuning rate; the grid's first setting
    stays as a sensitivity row."""
    spec = get_reproduction("pfl")
    by_pair = {(c.a, c.b): c for c in spec.comparisons}
    assert by_pair[("c10_pat_fedbabu_official", "c10_pat_apfl")].kind == "none"
    assert "99.41" in by_pair[("c10_pat_fedbabu_official", "c10_pat_apfl")].note
    assert by_pair[("c10_pat_fedrep", "c10_pat_ditto")].kind == "direction"
    assert by_pair[("c10_pat_fedbabu", "c10_pat_apfl")].kind == "none"  # sensitivity
    babu = spec.condition("c10_pat_fedbabu_official")
    assert babu.algorithm == "fedbabu" and set(pfl.BABU_FT) <= set(babu.overrides)
    _, plan = _plan()
    cfg = plan[("c10_pat_fedbabu_official", 0)]
    assert cfg.algorithm.hparams["finetune_lr"] == 0.0005


def test_published_numbers_stand_beside_existing_conditions():
    spec = get_reproduction("pfl")
    names = {c.name for c in spec.conditions}
    assert spec.paper and set(spec.paper) <= names
    assert spec.paper["c10_dir_ditto"] == "97.47 ± 0.04"  # PFLlib, FMNIST, Dir(0.1)
    assert spec.paper["c10_pat_fedavg"] == "80.41 ± 0.08"  # PFLlib, FMNIST, pathological
    assert "FMNIST" in spec.paper_title


# ----------------------------------------------------------- the per-client metric

def _history(personal: list[float]) -> list[dict]:
    """Evaluations every other round; the global test accuracy stays at 0.1."""
    out = []
    for i, p in enumerate(personal):
        out += [{"round": 2 * i + 1, "train_loss": 1.0},
                {"round": 2 * i + 2, "train_loss": 1.0, "test_accuracy": 0.1,
                 "personal_accuracy_mean": p}]
    return out


def test_final_personal_acc_is_the_mean_of_the_last_five_evaluations():
    """0.1 … 0.7: the last five are 0.3 … 0.7, mean 0.5 (all seven: 0.4, the last: 0.7)."""
    run = summarize(_history([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]), 0, None, "test_accuracy")
    assert run.final_personal_acc == pytest.approx(0.5)
    assert run.final_acc == pytest.approx(0.1)
    bare = summarize(_history([0.5])[:1] + [{"round": 2, "test_accuracy": 0.2}], 0, None,
                     "test_accuracy")
    assert math.isnan(bare.final_personal_acc)  # a run without the per-client protocol


def test_the_verdict_and_table_use_the_per_client_accuracy():
    """Ditto's personal accuracy beats FedAvg's by 0.3 ± 0.01 while FedAvg's global test
    accuracy is the higher one: the comparison reads the per-client metric."""
    spec = get_reproduction("pfl")
    a, b = "c10_dir_ditto", "c10_dir_fedavg"

    def run(seed, glob, personal):
        return RunSummary(seed, 40.0, 1.0, glob, False, 1.0, [], final_personal_acc=personal)

    runs = {a: {s: run(s, 0.3, 0.80 + 0.01 * s) for s in (0, 1, 2)},
            b: {s: run(s, 0.5, 0.50 + 0.01 * s + 0.001 * (s == 1)) for s in (0, 1, 2)}}
    j = next(j for j in judge(spec, runs) if (j.comp.a, j.comp.b) == (a, b))
    assert j.diff.mean == pytest.approx(0.3, abs=1e-3) and j.call == "reproduced"
    table = condition_table(spec, runs, [a, b])
    assert "final per-client acc." in table.splitlines()[0]
    assert "0.8100" in table and "0.3000" in table
