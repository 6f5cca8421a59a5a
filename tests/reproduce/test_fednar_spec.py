"""The FedNAR reproduction: every backbone runs with and without NAR on the release settings."""

from __future__ import annotations

from pathlib import Path

from fedforge.reproduce import get_reproduction
from fedforge.reproduce.grid import grid_plan

ROOT = Path(__file__).resolve().parents[2]


def _plan():
    spec = get_reproduction("fednar")
    return spec, {(c.name, cfg.seed): cfg for c, cfg, _ in grid_plan(spec, ROOT, Path("runs"))}


def test_each_backbone_is_paired_with_and_without_nar_on_the_same_seeds():
    spec, plan = _plan()
    for comp in spec.comparisons:
        assert comp.metric == "final_acc" and comp.expect == ">"
        for seed in spec.seeds:
            a, b = plan[(comp.a, seed)], plan[(comp.b, seed)]
            assert a.client.nar is True and b.client.nar is False
            # everything else equal: the pair differs only in where the decay enters
            da, db = a.model_dump(), b.model_dump()
            da["client"].pop("nar"), db["client"].pop("nar")
            assert da == db
    assert {c.a.removesuffix("_nar") for c in spec.comparisons} == {
        "fedavg", "fedprox", "scaffold", "fedexp", "fedadam", "fedavgm",
        "shk_fedavg", "shk_fedadam"}


def test_release_script_settings_come_from_the_config():
    """FedExP with eps = 0, FedAdam with the code's rule, η = 0.1 and decaying τ, FedProx
    μ = 0.001, λ = 0.05 / 0.01 by backbone, γ = 0.998 (ljb121002/fednar scripts); A = 5."""
    _, plan = _plan()
    fedexp, fedadam = plan[("fedexp_nar", 0)], plan[("fedadam_nar", 0)]
    assert fedexp.algorithm.eps == 0.0 and fedexp.client.weight_decay == 0.01
    assert fedadam.algorithm.server_lr == 0.1 and fedadam.algorithm.adam_rule == "fednar_code"
    assert fedadam.algorithm.tau == {"schedule": "exponential", "init": 0.01, "gamma": 0.996004}
    assert plan[("fedprox_nar", 0)].algorithm.mu == 0.001
    assert plan[("fedavgm_nar", 0)].client.weight_decay == 0.01
    for name in ("fedavg_nar", "fedprox_nar", "scaffold_nar"):
        assert plan[(name, 0)].client.weight_decay == 0.05
    cfg = plan[("fedavg_vanilla", 1)]
    assert cfg.client.max_grad_norm == 5.0  # the regime: see the spec's notes
    assert plan[("fedavg_a10_nar", 1)].client.max_grad_norm == 10.0
    assert cfg.client.lr == {"schedule": "exponential", "init": 0.01, "gamma": 0.998}
    assert cfg.data.partition == "dirichlet_equal" and cfg.data.partition_options["alpha"] == 0.3
    shk = plan[("shk_fedadam_nar", 2)]
    assert shk.data.dataset == "shakespeare" and shk.client.lr["init"] == 0.01
    assert shk.client.max_grad_norm == 3.0  # Shakespeare's regime: see the spec's notes
    assert plan[("shk_fedavg_a10_vanilla", 0)].client.max_grad_norm == 10.0
