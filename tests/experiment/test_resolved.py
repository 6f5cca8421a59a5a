"""What a run records and how it weights clients: every default written out, names, weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib
import torch

from fedforge.algorithms import ALIASES, build_algorithm, resolved_hparams
from fedforge.experiment.build import resolve_config, sample_round
from fedforge.experiment.config import load_config
from fedforge.experiment.runner import Experiment, run_experiment

ROOT = Path(__file__).resolve().parents[2]
QUICK = ROOT / "examples/quickstart.toml"


def test_resolved_config_records_every_default(tmp_path):
    cfg = load_config(QUICK, ["rounds=1", "algorithm.name=fedadam"])
    run_experiment(cfg, tmp_path / "run", progress=False)
    saved = tomllib.loads((tmp_path / "run/config.resolved.toml").read_text())
    want = {k: v for k, v in resolved_hparams("fedadam", {"local_lr": 0.01}).items()
            if v is not None}
    assert {k: v for k, v in saved["algorithm"].items() if k != "name"} == want
    assert saved["server"]["aggregation"] == "uniform"  # Reddi et al.: 1/|S|


def test_a_run_builds_its_algorithm_once(tmp_path, monkeypatch):
    """Resolving the config and building the run share one build (the loaded config was
    validated before, which builds it for its own checks)."""
    from fedforge.experiment import build

    calls = []

    def counted(name, **kwargs):
        calls.append(name)
        return build_algorithm(name, **kwargs)

    cfg = load_config(QUICK, ["rounds=1", "algorithm.name=scaffold"])
    monkeypatch.setattr(build, "build_algorithm", counted)
    run_experiment(cfg, tmp_path / "run", progress=False)
    assert calls == ["scaffold"]
    saved = tomllib.loads((tmp_path / "run/config.resolved.toml").read_text())
    assert saved["server"]["aggregation"] == "uniform" and saved["checkpoint"]["every"] == 10
    assert not {"tasks", "async", "sync", "system", "method"} & set(saved)


@pytest.mark.parametrize(("alias", "canonical"), sorted(ALIASES.items()))
def test_old_names_are_aliases_of_unambiguous_ones(alias, canonical):
    assert build_algorithm(alias).name == canonical
    cfg = resolve_config(load_config(QUICK, [f"algorithm.name={alias}"]))
    assert cfg.algorithm.name == canonical


def test_fedavg_weights_by_samples_and_scaffold_uniformly():
    """McMahan et al. weight client deltas by n_i / n; SCAFFOLD averages uniformly."""
    for name, uniform in (("fedavg", False), ("scaffold", True)):
        exp = Experiment.from_config(load_config(QUICK, [f"algorithm.name={name}"]))
        draw = sample_round(exp, 1)
        ids, agg = draw.client_ids, draw.agg_weights
        sizes = exp.client_sizes[ids].double()
        want = torch.full_like(sizes, 1 / len(ids)) if uniform else sizes / sizes.sum()
        torch.testing.assert_close(agg.double().cpu(), want, rtol=1e-6, atol=0)
        assert uniform or not torch.allclose(want, torch.full_like(want, 1 / len(ids)))


def test_explicit_aggregation_overrides_the_algorithm():
    cfg = load_config(QUICK, ["server.aggregation=uniform"])
    exp = Experiment.from_config(cfg)
    agg = sample_round(exp, 1).agg_weights
    assert torch.all(agg == agg[0])



def test_the_defaults_of_a_multitask_run_are_written_out():
    """A multi-task config naming no method and no checkpoint period resolves to FedAST and
    2000 client updates; one task, to 10 rounds; a period it names is kept."""
    cfg = load_config(ROOT / "examples/fedast_cpu_2tasks.toml",
                      ["method=null", "checkpoint.every=null"])
    assert cfg.method is None and cfg.method_name == "fedast"
    resolved = resolve_config(cfg)
    assert (resolved.method, resolved.checkpoint.every) == ("fedast", 2000)
    kept = resolve_config(load_config(ROOT / "examples/fedast_cpu_2tasks.toml",
                                      ["method=sync_st", "checkpoint.every=7"]))
    assert (kept.method, kept.checkpoint.every) == ("sync_st", 7)
    single = load_config(QUICK, ["checkpoint.every=null"])
    assert resolve_config(single).checkpoint.every == 10
    assert single.checkpoint.period(multitask=True) == 2000
