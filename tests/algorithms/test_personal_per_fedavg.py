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
from tests.algorithms.personal_rounds import (
    ENGINES,
    ROWS,
    batches,
    quad_grad,
    quadratic,
    run,
    samples,
)

ALPHA, BETA, DELTA, W0 = 0.2, 0.3, 1e-3, np.array([0.4, -0.3])
LOSS = quadratic(lambda p: p["w"])


def reference(variant: str):
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
                wl = wl - BETA * g
            finals.append(wl)
        w = np.mean(finals, axis=0)
        out.append(w.copy())
    return out


def _run(variant: str, engine=None):
    extra = {"delta": DELTA} if variant == "hf" else {}
    algorithm = build_algorithm(f"per_fedavg_{variant}", local_lr=ALPHA, beta=BETA, **extra)
    x, y = torch.tensor(ROWS), torch.zeros(len(ROWS), dtype=torch.long)
    return algorithm, run(algorithm, LOSS, {"w": W0}, x, y, batches(batch=3), engine)


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
