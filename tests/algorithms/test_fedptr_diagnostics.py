"""FedPTR diagnostics by hand: per-layer drift, distance to w̃, prox magnitude, the projected
model's test accuracy and the MTT seconds, for both variants."""

from __future__ import annotations

import math

import pytest
import torch

from fedforge.algorithms.fedptr import ClientProjection, ProjectionConfig, ServerProjection
from fedforge.client.transforms import RoundContext
from fedforge.protocol.algorithm import FinalizeInputs

X = {"a.weight": torch.tensor([0.0, 0.0]), "a.bias": torch.tensor([0.0]),
     "b.weight": torch.zeros(2, 2)}
ANCHOR = {"a.weight": torch.tensor([3.0, 4.0]), "a.bias": torch.tensor([0.0]),
          "b.weight": torch.ones(2, 2)}
CLIENT = {"a.weight": torch.tensor([-1.0, 0.0]), "a.bias": torch.tensor([0.0]),
          "b.weight": torch.full((2, 2), 0.5)}


def _fin(ctx):
    delta = {k: X[k] - CLIENT[k] for k in X}
    return FinalizeInputs(ctx, delta, CLIENT, {}, None, torch.tensor(1.0))


def _ctx(server_side: bool):
    if server_side:
        return RoundContext(X, {"fedptr_s": {"anchor": ANCHOR}}, {}, {})
    return RoundContext(X, {}, {}, {"fedptr_anchor": ANCHOR, "fedptr_lam": torch.tensor(0.2)})


@pytest.mark.parametrize("server_side", [False, True])
@pytest.mark.parametrize("adaptive", [True, False])
def test_per_layer_metrics_by_hand(server_side, adaptive):
    """Drift ||x_i - x||: a (1, 0 | 0) -> 1, b 0.5 x 4 -> 1. ||x - w̃||: a (3, 4 | 0) -> 5,
    b ones -> 2. Final gap ||x_i - w̃||: a (-4, -4 | 0) -> sqrt 32, b -0.5 x 4 -> 1; prox
    norm λ = 0.2 (adaptive) or λ·gap = 0.2 sqrt 32, 0.2 (fixed)."""
    kind = ServerProjection if server_side else ClientProjection
    part = kind(ProjectionConfig(), lam=0.2, adaptive=adaptive)
    m = {k: float(v) for k, v in part.client_metrics(_fin(_ctx(server_side))).items()}
    assert m["fedptr_drift/a"] == pytest.approx(1.0) and m["fedptr_drift/b"] == pytest.approx(1.0)
    assert m["fedptr_anchor_dist/a"] == pytest.approx(5.0)
    assert m["fedptr_anchor_dist/b"] == pytest.approx(2.0)
    prox_a = 0.2 if adaptive else 0.2 * math.sqrt(32.0)
    assert m["fedptr_prox/a"] == pytest.approx(prox_a) and m["fedptr_prox/b"] == pytest.approx(0.2)
    assert len(m) == 6  # one key per layer and quantity


def test_warm_up_prox_is_zero():
    ctx = RoundContext(X, {}, {}, {"fedptr_anchor": X, "fedptr_lam": torch.tensor(0.0)})
    part = ClientProjection(ProjectionConfig(), lam=0.2)
    m = part.client_metrics(_fin(ctx))
    assert float(m["fedptr_prox/a"]) == 0.0 and float(m["fedptr_anchor_dist/b"]) == 0.0


def test_projected_model_is_scored_every_n_active_rounds():
    part = ClientProjection(ProjectionConfig(), lam=0.2, eval_projected_every=5)
    part.bind_eval(lambda p: {"test_accuracy": float(p["a.weight"].sum())})
    part._keep_projected(4, ANCHOR, True)  # not a multiple of 5
    part._keep_projected(5, X, False)  # warm-up: w̃ = x, nothing to score
    assert "fedptr_projected_accuracy" not in part.server_metrics({}, {})
    part._keep_projected(10, ANCHOR, True)
    m = part.server_metrics({}, {})
    assert m["fedptr_projected_accuracy"] == 7.0 and m["fedptr_projected_round"] == 10
    assert "fedptr_projected_accuracy" not in part.server_metrics({}, {})  # reported once
    with pytest.raises(ValueError, match="algorithm.eval_projected_every"):
        ClientProjection(ProjectionConfig(), eval_projected_every=-1)


SMALL = {"window": 1, "ipc": 1, "outer_steps": 2, "inner_steps": 2, "proj_steps": 2,
         "lr_img": 10.0}


@pytest.mark.parametrize("name", ["fedptr", "fedptr_s"])
def test_a_run_logs_the_diagnostics(tmp_path, name):
    """Window m = 1: warm-up in rounds 1-2, MTT and the prox from round 3 on."""
    from fedforge.experiment.config import validate
    from fedforge.experiment.runner import run_experiment

    cfg = validate({
        "seed": 3, "rounds": 4,
        "data": {"dataset": "synthetic", "partition": "natural",
                 "options": {"num_clients": 4, "alpha": 0.5, "beta": 0.5}},
        "model": {"name": "logreg"},
        "algorithm": {"name": name, "local_lr": 0.05, "lam": 0.05,
                      "eval_projected_every": 2, **SMALL},
        "client": {"batch_size": 8, "local_steps": 2}, "server": {"clients_per_round": 4},
        "eval": {"every": 1},
    })
    hist = run_experiment(cfg, tmp_path / "r", progress=False)
    layer = next(k for k in hist[0] if k.startswith("fedptr_drift/")).split("/", 1)[1]
    assert [r[f"fedptr_prox/{layer}"] for r in hist] == pytest.approx([0, 0, 0.05, 0.05])
    assert all(r[f"fedptr_drift/{layer}"] > 0 for r in hist)
    assert hist[0]["fedptr_mtt_s"] == 0.0 and hist[2]["fedptr_mtt_s"] > 0.0
    assert [("fedptr_projected_accuracy" in r) for r in hist] == [False, False, False, True]
    assert 0.0 <= hist[3]["fedptr_projected_accuracy"] <= 1.0
