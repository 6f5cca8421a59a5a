"""FedALA against a float64 NumPy loop of Zhang et al.'s adaptive local aggregation (three
rounds, partial participation, a padded step) on a three-leaf model ``u = a + 2b + 3c``:
ALA on the top two tensors (b, c; a takes the global value), its weights learned with
η = 0.5 on the first half of the round's batches, local SGD from the aggregated model, the
trained model kept as the client's own. Every leaf has its own gradient scale, so learning
weights on the wrong leaves, over every batch, or averaging the wrong model gives other
numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedforge.algorithms import build_algorithm
from fedforge.algorithms.personal.fedala import top
from tests.algorithms.personal_rounds import (
    ENGINES,
    ROWS,
    SCHEDULE,
    quad_grad,
    quadratic,
    run_rows,
    samples,
)

LR, ETA, PERCENT = 0.05, 0.5, 50.0
P0 = {"a": np.array([0.4, -0.3]), "b": np.array([0.1, 0.2]), "c": np.array([-0.2, 0.1])}
SCALE = {"a": 1.0, "b": 2.0, "c": 3.0}
LOSS = quadratic(lambda p: p["a"] + 2.0 * p["b"] + 3.0 * p["c"])


def gradients(p, rows):
    du = quad_grad(sum(SCALE[k] * p[k] for k in p), ROWS[rows])
    return {k: SCALE[k] * du for k in p}


def reference(percent=PERCENT, eta=ETA, schedule=SCHEDULE, upper=1.0):
    glob = {k: v.copy() for k, v in P0.items()}
    local = {i: {k: v.copy() for k, v in P0.items()} for i in range(3)}
    weights = {i: {k: np.ones(2) for k in ("b", "c")} for i in range(3)}
    out = []
    for cohort in samples(schedule):
        finals = []
        for i, steps in cohort:
            mine, w = local[i], weights[i]

            def mix(mine=mine, w=w, glob=glob):
                return {k: mine[k] + (glob[k] - mine[k]) * w[k] if k in w else glob[k].copy()
                        for k in glob}

            for rows in steps[:math.ceil(len(steps) * percent / 100)]:
                g = gradients(mix(), rows)
                for k in w:
                    w[k] = np.clip(w[k] - eta * g[k] * (glob[k] - mine[k]), 0.0, upper)
            p = mix()
            for rows in steps:
                g = gradients(p, rows)
                p = {k: p[k] - LR * g[k] for k in p}
            local[i] = p
            finals.append(p)
        glob = {k: np.mean([f[k] for f in finals], axis=0) for k in glob}
        out.append(({k: v.copy() for k, v in glob.items()},
                    {i: {k: v.copy() for k, v in local[i].items()} for i in range(3)},
                    {i: {k: v.copy() for k, v in weights[i].items()} for i in range(3)}))
    return out


def _run(engine=None, percent=PERCENT, eta=ETA, schedule=SCHEDULE):
    algorithm = build_algorithm("fedala", local_lr=LR, eta=eta, rand_percent=percent)
    return algorithm, run_rows(algorithm, LOSS, P0, engine, schedule)


def test_fedala_matches_adaptive_local_aggregation():
    algorithm, got = _run()
    for (params, state), (glob, local, weights) in zip(got, reference(), strict=True):
        for k in P0:
            np.testing.assert_allclose(params[k], glob[k], rtol=1e-10)
            np.testing.assert_allclose(state[f"personal/local/{k}"],
                                       [local[i][k] for i in range(3)], rtol=1e-10)
        for k in ("b", "c"):
            np.testing.assert_allclose(state[f"personal/weights/{k}"],
                                       [weights[i][k] for i in range(3)], rtol=1e-10)
    assert not np.allclose(state["personal/weights/c"], 1.0)  # the weights did move
    mine = {"personal": {"local": {k: torch.tensor(v) for k, v in local[0].items()},
                         "weights": {k: torch.tensor(v) for k, v in weights[0].items()}}}
    evaluated = algorithm.personal.client_params({k: torch.tensor(v) for k, v in glob.items()},
                                                 mine)
    np.testing.assert_allclose(evaluated["a"].numpy(), glob["a"])
    np.testing.assert_allclose(evaluated["c"].numpy(),
                               local[0]["c"] + (glob["c"] - local[0]["c"]) * weights[0]["c"])


def test_fedala_loop_equals_vmap():
    for (p, s), (q, t) in zip(_run(ENGINES["loop"])[1], _run(ENGINES["vmap"])[1], strict=True):
        for k in p:
            np.testing.assert_allclose(p[k], q[k], rtol=1e-10)
        for k in s:
            np.testing.assert_allclose(s[k], t[k], rtol=1e-10)


def test_fedala_top_layers_are_the_last_tensors():
    assert top(["a", "b", "c"], 2) == ("b", "c")
    assert top(["a"], 2) == ("a",)


@pytest.mark.parametrize(("key", "value"), [("rand_percent", 0.0), ("layer_idx", 0),
                                            ("eta", -1.0)])
def test_fedala_refuses_bad_hparams(key, value):
    with pytest.raises(ValueError, match=f"algorithm.{key}"):
        build_algorithm("fedala", **{key: value})


# four steps per client: a step with one real sample, a padded last step (client 2 in
# rounds 1 and 3 has four real steps); the share of steps that learn W_i is ceil(steps · p / 100)
# of the steps with data, so 67 % learns on 3 of 3 (2 of 3 at p/101 or when a one-sample
# step is not counted), 30 % on 1 of 3 (2 of 4 if the padded step counted)
LONG = [
    ([0, 1, 2], [[[0, 1, 2], [2, -1, -1], [1, 0, 2], [-1, -1, -1]],
                 [[3, 4, 5], [5, 3, 4], [4, -1, -1], [-1, -1, -1]],
                 [[6, 7, 8], [8, 6, 7], [7, 8, 6], [6, -1, -1]]]),
    ([0, 2], [[[1, 2, 0], [0, -1, -1], [2, 1, 0], [-1, -1, -1]],
              [[7, 8, 6], [6, 7, 8], [8, -1, -1], [-1, -1, -1]]]),
    ([1, 2, 0], [[[4, 5, 3], [3, -1, -1], [5, 4, 3], [-1, -1, -1]],
                 [[6, 8, 7], [7, 6, 8], [8, 7, -1], [6, -1, -1]],
                 [[2, 1, 0], [1, 0, 2], [0, -1, -1], [-1, -1, -1]]]),
]


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize(("percent", "eta"), [(67.0, 0.5), (30.0, 0.5), (67.0, 40.0)])
def test_fedala_learns_on_its_share_of_the_steps_with_data(percent, eta, engine):
    """The share counts the steps with data (one sample is enough, padding is not: the
    vmap engine pads every client to the cohort's steps), each learning step once; a large
    η drives W_i past both ends of [0, 1]."""
    got = _run(ENGINES[engine], percent=percent, eta=eta, schedule=LONG)[1]
    want = reference(percent, eta, LONG)
    for (params, state), (glob, _, weights) in zip(got, want, strict=True):
        for k in P0:
            np.testing.assert_allclose(params[k], glob[k], rtol=1e-10)
        for k in ("b", "c"):
            np.testing.assert_allclose(state[f"personal/weights/{k}"],
                                       [weights[i][k] for i in range(3)], rtol=1e-10)
    if eta > 1:  # the clip binds at both ends
        unclipped = reference(percent, eta, LONG, upper=np.inf)
        assert not np.allclose(want[-1][0]["c"], unclipped[-1][0]["c"])
        assert any((w[k] == 0.0).any() for _, _, ws in want for w in ws.values() for k in w)
