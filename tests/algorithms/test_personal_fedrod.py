"""FedRoD against a float64 NumPy loop (three rounds, partial participation, a padded step) on
a linear classifier ``z = W (B x) + b``: the shared model steps on the balanced softmax (logits
+ log of the client's label counts over the round's batches; a class it lacks gets share 0),
the personal head on the cross-entropy of the summed logits with the features fixed, and the
client's evaluated model is the global one with the summed head. Client 1 has no sample of
class 2, and the counts are uneven, so plain cross-entropy, a wrong prior or training the
personal head through the body all give other numbers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedforge.algorithms import build_algorithm
from tests.algorithms.personal_rounds import ENGINES, SCHEDULE, batches, run, samples

LR = 0.5
X = np.array([[1.0, 0.0], [0.5, -1.0], [-1.0, 2.0], [0.0, 2.0], [2.0, 1.0], [-0.5, 0.5],
              [1.0, -1.0], [-2.0, 0.0], [0.3, 0.9]])
Y = np.array([0, 1, 2, 0, 1, 0, 2, 2, 1])
P0 = {"body": np.array([[1.0, 0.2], [-0.3, 0.8]]),
      "head.weight": np.array([[0.5, -0.2], [0.1, 0.3], [-0.4, 0.6]]),
      "head.bias": np.array([0.1, -0.2, 0.05])}


def loss(params, x, y, w):
    logits = (x @ params["body"].T) @ params["head.weight"].T + params["head.bias"]
    return (F.cross_entropy(logits, y, reduction="none") * w).sum() / w.sum().clamp_min(1.0)


def grads(body, W, b, rows):
    x, y = X[rows], Y[rows]
    h = x @ body.T
    z = h @ W.T + b
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    dz = (p - np.eye(3)[y]) / len(rows)
    return (dz @ W).T @ x, dz.T @ h, dz.sum(0)


def reference(schedule=SCHEDULE):
    body, W, b = P0["body"].copy(), P0["head.weight"].copy(), P0["head.bias"].copy()
    mine = {i: (P0["head.weight"].copy(), P0["head.bias"].copy()) for i in range(3)}
    out = []
    for cohort in samples(schedule):
        finals = []
        for i, steps in cohort:
            counts = np.bincount(Y[[s for rows in steps for s in rows]], minlength=3)
            prior = np.where(counts > 0, np.log(np.maximum(counts, 1)), -1e4)
            bo, w_, b_ = body.copy(), W.copy(), b.copy()
            pw, pb = mine[i]
            for rows in steps:
                gb, gw, gbias = grads(bo, w_, b_ + prior, rows)
                _, hw, hb = grads(bo, w_ + pw, b_ + pb, rows)
                pw, pb = pw - LR * hw, pb - LR * hb
                bo, w_, b_ = bo - LR * gb, w_ - LR * gw, b_ - LR * gbias
            mine[i] = (pw, pb)
            finals.append((bo, w_, b_))
        body, W, b = (np.mean([f[j] for f in finals], axis=0) for j in range(3))
        out.append(({"body": body, "head.weight": W, "head.bias": b},
                    dict(mine)))
    return out


def _run(engine=None, params=P0, schedule=SCHEDULE):
    algorithm = build_algorithm("fedrod", local_lr=LR, head=["head.*"])
    x, y = torch.tensor(X), torch.tensor(Y)
    return algorithm, run(algorithm, loss, params, x, y, batches(schedule), engine)


def test_fedrod_matches_balanced_softmax_and_personal_head():
    algorithm, got = _run()
    for (params, state), (ref, mine) in zip(got, reference(), strict=True):
        for k in P0:
            np.testing.assert_allclose(params[k], ref[k], rtol=1e-10, atol=1e-14)
        for i in range(3):
            np.testing.assert_allclose(state["personal/head/head.weight"][i], mine[i][0],
                                       rtol=1e-10)
            np.testing.assert_allclose(state["personal/head/head.bias"][i], mine[i][1],
                                       rtol=1e-10)
    g = {k: torch.tensor(v) for k, v in ref.items()}
    own = {"personal": {"head": {"head.weight": torch.tensor(mine[1][0]),
                                 "head.bias": torch.tensor(mine[1][1])}}}
    evaluated = algorithm.personal.client_params(g, own)
    np.testing.assert_allclose(evaluated["head.weight"].numpy(), ref["head.weight"] + mine[1][0])
    np.testing.assert_allclose(evaluated["body"].numpy(), ref["body"])


def test_fedrod_loop_equals_vmap():
    for (p, s), (q, t) in zip(_run(ENGINES["loop"])[1], _run(ENGINES["vmap"])[1], strict=True):
        for k in p:
            np.testing.assert_allclose(p[k], q[k], rtol=1e-9)
        for k in s:
            np.testing.assert_allclose(s[k], t[k], rtol=1e-9)


def test_fedrod_refuses_a_head_without_one_bias():
    algorithm = build_algorithm("fedrod", head=["head.weight"])
    with pytest.raises(ValueError, match="fedrod: the model's head needs exactly one bias"):
        algorithm.client_init({k: torch.tensor(v) for k, v in P0.items()})


# partly padded steps (the label counts take real samples only) and the head first in
# parameter order (the split's patterns name it, not the last layer)
PADDED = [([0, 1, 2], [[[0, 1, -1], [2, 0, 1]], [[3, -1, -1], [5, 3, 4]],
                       [[6, 7, 8], [8, -1, -1]]]),
          ([0, 2], [[[1, 2, 0], [0, -1, -1]], [[7, 8, -1], [-1, -1, -1]]])]
HEAD_FIRST = {k: P0[k] for k in ("head.weight", "head.bias", "body")}


def test_fedrod_counts_real_samples_and_takes_the_head_from_the_patterns():
    got = _run(params=HEAD_FIRST, schedule=PADDED)[1]
    for (params, state), (ref, mine) in zip(got, reference(PADDED), strict=True):
        for k in P0:
            np.testing.assert_allclose(params[k], ref[k], rtol=1e-10, atol=1e-14)
        assert sorted(k for k in state if k.startswith("personal/")) == [
            "personal/head/head.bias", "personal/head/head.weight"]
        for i in range(3):
            np.testing.assert_allclose(state["personal/head/head.bias"][i], mine[i][1],
                                       rtol=1e-10)
