"""The FedPTR reproduction: the paper's federation, scaled model and data, the ablations."""

from __future__ import annotations

from pathlib import Path

from fedforge.algorithms import algorithm_hparams
from fedforge.reproduce import get_reproduction
from fedforge.reproduce.grid import grid_plan

ROOT = Path(__file__).resolve().parents[2]


def _plan():
    spec = get_reproduction("fedptr")
    return spec, {(c.name, cfg.seed): cfg for c, cfg, _ in grid_plan(spec, ROOT, Path("runs"))}


def test_federation_is_the_papers_and_the_scale_is_documented():
    spec, plan = _plan()
    assert spec.seeds == (0, 1, 2) and len(spec.conditions) == 22
    for (name, _seed), cfg in plan.items():
        assert cfg.rounds >= 100 and cfg.client.batch_size == 500
        assert cfg.client.local_epochs == 1 and cfg.client.local_steps is None
        assert cfg.model.options == {"depth": 3, "width": 16}
        assert cfg.data.options == {"max_train": 10000}
        if name.endswith("_central"):  # drift check: one client holding every sample
            assert cfg.data.num_clients == cfg.server.clients_per_round == 1
            assert cfg.algorithm.name == "fedavg"
            continue
        assert cfg.data.num_clients == cfg.server.clients_per_round == 10
        assert cfg.data.partition == "dirichlet_class"
        assert cfg.data.partition_options == {"alpha": 0.01}
    assert {plan[(f"{p}_fedavg", 0)].data.dataset for p in ("c10", "fm")} == {
        "cifar10", "fashion_mnist"}


def test_ablations_change_one_thing():
    _, plan = _plan()
    base = plan[("fm_fedptr", 2)].model_dump()
    for name, key, value in (("fm_fedptr_fixed", "adaptive", False),
                             ("fm_fedptr_mtt4", "mtt_every", 4)):
        other = plan[(name, 2)].model_dump()
        assert other["algorithm"].pop(key) == value
        assert other == base
    assert plan[("c10_fedptr_s", 0)].algorithm.outer_steps == 3


def test_momentum_control_is_fedavg_with_fedptrs_local_optimizer():
    _, plan = _plan()
    fedptr = plan[("fm_fedptr", 1)].model_dump()["algorithm"]
    control, fedavg = plan[("fm_fedavg_m05", 1)].model_dump(), plan[("fm_fedavg", 1)].model_dump()
    assert control["algorithm"].pop("client_optimizer") == "momentum"
    assert control["algorithm"].pop("local_momentum") == 0.5
    defaults = algorithm_hparams("fedptr")  # what FedPTR's clients run unless overridden
    assert fedptr.get("client_optimizer", defaults["client_optimizer"]) == "momentum"
    assert fedptr.get("local_momentum", defaults["local_momentum"]) == 0.5
    for cfg in (control, fedavg):
        cfg["algorithm"].pop("client_optimizer", None)
        cfg["algorithm"].pop("local_momentum", None)
    assert control == fedavg


def test_claim_compares_both_variants_with_every_baseline():
    spec, _ = _plan()
    pairs = {(c.a, c.b) for c in spec.comparisons}
    for p in ("c10", "fm"):
        for m in ("fedptr", "fedptr_s"):
            for b in ("fedavg", "fedprox", "scaffold", "feddyn", "feddc"):
                assert (f"{p}_{m}", f"{p}_{b}") in pairs
        assert (f"{p}_fedptr", f"{p}_fedptr_fixed") in pairs
        assert (f"{p}_fedptr", f"{p}_fedavg_m05") in pairs
    assert len(pairs) == 24
    assert spec.paper["c10_fedptr"] == "69.04" and spec.paper["fm_fedptr_s"] == "85.48"
