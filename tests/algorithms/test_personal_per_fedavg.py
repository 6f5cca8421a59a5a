"""Per-FedAvg (FO and HF) against a float64 NumPy loop of Fallah et al.'s local step (three
rounds, partial participation, a padded step): each step's batch is cut into D, D' (and D''),
``temp = w - α ∇f(w; D)``, the meta step of β on ∇f(temp; D'), corrected in HF by α times
the Hessian-vector product on D''. α ≠ β, and the parts have different samples, so using
the wrong part, the wrong point or dropping the correction gives other numbers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedforge.algorithms import build_algorithm
from fedforge.algorithms.personal.perfedavg import _per_fedavg
from fedforge.client.transforms import RoundContext, local_step
from tests.algorithms.personal_rounds import ENGINES, ROWS, quad_grad, quadratic, run_rows, samples

ALPHA, BETA, DELTA, W0 = 0.2, 0.3, 1e-3, np.array([0.4, -0.3])
LOSS = quadratic(lambda p: p["w"])


def meta_step(w, g, decay=0.0, clip=None, nar=False):
    """The meta step through the client optimizer: SGD of β with L2 decay and clipping
    (FedNAR: the decay inside the clip)."""
    def clipped(u):
        return u if clip is None else u * min(1.0, clip / (np.linalg.norm(u) + 1e-12))
    return w - BETA * (clipped(g + decay * w) if nar else clipped(g) + decay * w)


def reference(variant: str, **outer):
    parts = 3 if variant == "hf" else 2
    w, out = W0.copy(), []
    for cohort in samples(batch=3):
        finals = []
        for _, steps in cohort:
            wl = w.copy()
            for rows in steps:
                cut = [(len(rows) * j) // parts for j in range(parts + 1)]
                d, d1, *d2 = [ROWS[rows[lo:hi]] for lo, hi in zip(cut[:-1], cut[1:])]
                temp = wl - ALPHA * quad_grad(wl, d)
                g = quad_grad(temp, d1)
                if d2:
                    hv = (quad_grad(wl + DELTA * g, d2[0]) - quad_grad(wl - DELTA * g, d2[0]))
                    g = g - ALPHA * hv / (2 * DELTA)
                wl = meta_step(wl, g, **outer)
            finals.append(wl)
        w = np.mean(finals, axis=0)
        out.append(w.copy())
    return out


def _run(variant: str, engine=None, **hparams):
    extra = {"delta": DELTA} if variant == "hf" else {}
    algorithm = build_algorithm(f"per_fedavg_{variant}", local_lr=ALPHA, beta=BETA, **extra,
                                **hparams)
    return algorithm, run_rows(algorithm, LOSS, {"w": W0}, engine, batch=3)


@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_per_fedavg_matches_the_papers_meta_step(variant):
    algorithm, got = _run(variant)
    for (params, _), w in zip(got, reference(variant), strict=True):
        np.testing.assert_allclose(params["w"], w, rtol=1e-8)
    assert algorithm.personal.finetune_steps == 1  # one step of α at evaluation
    # the two variants differ here: the Hessian correction is not negligible
    assert not np.allclose(reference("fo")[-1], reference("hf")[-1], rtol=1e-3)


@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_per_fedavg_loop_equals_vmap(variant):
    for (p, _), (q, _) in zip(_run(variant, ENGINES["loop"])[1],
                              _run(variant, ENGINES["vmap"])[1], strict=True):
        np.testing.assert_allclose(p["w"], q["w"], rtol=1e-10)


def test_per_fedavg_hf_refuses_a_non_positive_delta():
    with pytest.raises(ValueError, match="algorithm.delta"):
        build_algorithm("per_fedavg_hf", delta=0.0)


@pytest.mark.parametrize("nar", [False, True])
def test_per_fedavg_meta_step_takes_the_client_optimizers_decay_and_clip(nar):
    """weight_decay, max_grad_norm and nar reach the meta step (the clip binds here)."""
    _, got = _run("fo", weight_decay=0.1, max_grad_norm=0.05, nar=nar)
    want = reference("fo", decay=0.1, clip=0.05, nar=nar)
    for (params, _), w in zip(got, want, strict=True):
        np.testing.assert_allclose(params["w"], w, rtol=1e-8)
    assert not np.allclose(want[-1], reference("fo", decay=0.1, clip=0.05, nar=not nar)[-1])
    assert not np.allclose(want[-1], reference("fo", decay=0.1)[-1])


def test_per_fedavg_evaluation_is_finetune_steps_of_sgd_with_alpha():
    spec = build_algorithm("per_fedavg_fo", local_lr=ALPHA, finetune_steps=0,
                           client_optimizer="adam").personal
    assert spec.finetune_steps == 0
    tuner = spec.finetuner()
    w, g = torch.tensor([0.4, -0.3]), torch.tensor([1.0, 2.0])
    ctx = RoundContext({"w": w}, {"round": torch.tensor(1.0)}, {}, {})
    opt = tuner.local_optimizer
    new, _ = local_step(opt, {"w": g}, opt.init({"w": w}, ctx), {"w": w}, ctx)
    np.testing.assert_allclose(new["w"].numpy(), (w - ALPHA * g).numpy())  # plain SGD of α


def test_per_fedavg_errors_name_the_field():
    with pytest.raises(ValueError) as err:
        build_algorithm("per_fedavg_fo", finetune_steps=-1)
    assert str(err.value) == "algorithm.finetune_steps: expected >= 0, got -1"
    with pytest.raises(ValueError) as err:
        _per_fedavg("x", "so", ALPHA, BETA, DELTA, 1, "sgd", 0.0, None, False)
    assert str(err.value) == "per_fedavg variant: expected one of ('fo', 'hf'), got 'so'"
    with pytest.raises(ValueError) as err:  # α is read before the evaluation step's SGD
        build_algorithm("per_fedavg_fo", local_lr={"kind": "zz"})
    assert str(err.value).startswith("local_lr: schedule kind 'zz' unknown")
