"""FLoRA (Wang et al. 2024) against an independent float64 reference written from the paper.

The problem: one adapted linear ``M = W + s B A`` (``s = lora_alpha / r``) and a bias, client
k's loss ``1/2 ||M - T_k||^2 + 1/2 ||b - u_k||^2``. Each round every sampled client starts
from the round's A and B = 0, takes its own number of SGD steps at its own rank (ranks 2, 4
and 8 inside r = 8), and the server adds ``s sum_k p_k B_k A_k`` (p_k = n_k / n) to W and
averages the bias by samples. Three rounds of changing cohorts, a client with no steps, and
sample counts that are not equal, so both FedIT's rule (``mean B mean A``) and uniform
weights differ from the engine's rounds, and the tests say so.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedforge.algorithms import build_algorithm
from fedforge.algorithms.flora import fresh_a, stack
from fedforge.core.store import ClientStore
from fedforge.engine import LoopEngine, VmapEngine
from fedforge.engine.draw import RoundDraw
from fedforge.engine.round import RoundSetup, federated_round
from fedforge.errors import ConfigError
from fedforge.models.lora import LoraLinear

IN, OUT, R, ALPHA, LR, SEED = 3, 2, 8, 4.0, 0.3, 7
S = ALPHA / R
RANKS = (2, 4, 8)  # client i trains RANKS[i % 3]: clients 0..4 -> 2, 4, 8, 2, 4
N, K = 5, 3
COUNTS = np.array([3, 1, 2, 5, 4])  # n_k: the sample weights p_k = n_k / n over the cohort
SCHEDULE = [([0, 1, 2], [3, 2, 3]), ([1, 3, 4], [3, 3, 0]), ([0, 2, 3, 4], [2, 3, 1, 3])]
GEN = np.random.default_rng(0)
TARGETS = GEN.normal(size=(N, OUT, IN))
BIASES = GEN.normal(size=(N, OUT))


class Toy(nn.Module):
    """The adapted linear whose LoRA scaling the algorithm reads (bind_model)."""

    def __init__(self) -> None:
        super().__init__()
        self.l = LoraLinear(nn.Linear(IN, OUT), R, ALPHA, 0.0)


def toy_loss(params, x, y, w):
    del y
    m = params["l.weight"] + S * params["l.lora_B"] @ params["l.lora_A"]
    t, u = x[:, : OUT * IN].reshape(-1, OUT, IN), x[:, OUT * IN:]
    per = 0.5 * ((m - t) ** 2).sum((1, 2)) + 0.5 * ((params["l.bias"] - u) ** 2).sum(-1)
    return (per * w).sum() / w.sum().clamp_min(1.0)


def _start() -> dict:
    g = torch.Generator().manual_seed(1)
    return {"l.weight": torch.randn(OUT, IN, generator=g, dtype=torch.float64),
            "l.bias": torch.randn(OUT, generator=g, dtype=torch.float64),
            "l.lora_A": torch.randn(R, IN, generator=g, dtype=torch.float64),
            "l.lora_B": torch.zeros(OUT, R, dtype=torch.float64)}


def run(algorithm, engine=None) -> list[dict]:
    """fedforge's rounds on the toy: the global leaves after each round."""
    engine = engine or LoopEngine()
    algorithm.bind_model(Toy())
    x_all = torch.tensor(np.c_[TARGETS.reshape(N, -1), BIASES])
    y_all = torch.zeros(N, dtype=torch.long)
    params = _start()
    state, store = algorithm.server_init(params), ClientStore(N, algorithm.client_init(params))
    out = []
    for t, (ids, steps) in enumerate(SCHEDULE, start=1):
        ids_t = torch.tensor(ids)
        idx = ids_t.view(-1, 1, 1).expand(-1, K, 1).clone()
        weights = torch.zeros(idx.shape, dtype=torch.float64)
        for c, k in enumerate(steps):
            weights[c, :k] = 1.0
        counts = torch.tensor(COUNTS)[ids_t]
        draw = RoundDraw(ids_t, idx, weights, counts.double() / counts.sum(),
                         info=algorithm.round_info(len(ids), torch.Generator()),
                         counts=counts, round=t)
        params, state, _ = federated_round(
            RoundSetup(algorithm, engine, toy_loss, store, x_all, y_all), params, state, draw)
        out.append({k: v.clone() for k, v in params.items()})
    return out


def reference(rule: str = "flora", weights: str = "samples") -> list[dict]:
    """The rounds in NumPy; ``rule = "fedit"`` averages A and B separately instead."""
    p0 = {k: v.numpy().copy() for k, v in _start().items()}
    w, b, a0 = p0["l.weight"], p0["l.bias"], p0["l.lora_A"]
    out = []
    for t, (ids, steps) in enumerate(SCHEDULE, start=1):
        n = COUNTS[ids] if weights == "samples" else np.ones(len(ids))
        p = n / n.sum()
        trained = []
        for i, k in zip(ids, steps, strict=True):
            keep = (np.arange(R) < RANKS[i % 3]).astype(float)
            a, bb, bias = a0.copy(), np.zeros((OUT, R)), b.copy()
            for _ in range(k):
                g = w + S * bb @ a - TARGETS[i]
                ga, gb = S * bb.T @ g, S * g @ a.T
                a, bb = a - LR * ga * keep[:, None], bb - LR * gb * keep
                bias = bias - LR * (bias - BIASES[i])
            trained.append((a * keep[:, None], bb, bias))
        if rule == "flora":
            w = w + S * sum(pk * bk @ ak for pk, (ak, bk, _) in zip(p, trained, strict=True))
        else:
            w = w + S * (sum(pk * bk for pk, (_, bk, _) in zip(p, trained, strict=True))
                         @ sum(pk * ak for pk, (ak, _, _) in zip(p, trained, strict=True)))
        b = sum(pk * bias for pk, (_, _, bias) in zip(p, trained, strict=True))
        a0 = fresh_a(_start(), SEED, t)["l.lora_A"].numpy()  # the round's shared draw
        out.append({"l.weight": w.copy(), "l.bias": b.copy(), "l.lora_A": a0.copy()})
    return out


def _flora():
    return build_algorithm("flora", local_lr=LR, ranks=list(RANKS), seed=SEED,
                           client_optimizer="sgd", max_grad_norm=None)


def test_three_flora_rounds_equal_the_papers_stacking_and_not_fedits_mean():
    got, want = run(_flora()), reference()
    fedit, uniform = reference("fedit"), reference(weights="uniform")
    for t, (g, r) in enumerate(zip(got, want, strict=True), start=1):
        for key, value in r.items():
            np.testing.assert_allclose(g[key].numpy(), value, rtol=1e-10, atol=1e-12,
                                       err_msg=f"round {t}: {key}")
        assert torch.equal(g["l.lora_B"], torch.zeros(OUT, R))  # a fresh adapter each round
    # the wrong rules move W elsewhere: FedIT's mean(B) mean(A), and weights 1/S
    for wrong in (fedit, uniform):
        assert np.abs(got[-1]["l.weight"].numpy() - wrong[-1]["l.weight"]).max() > 1e-3


def test_loop_and_vmap_run_the_same_flora_rounds():
    loop, vmap = run(_flora()), run(_flora(), VmapEngine(chunk_size=2))
    for a, b in zip(loop, vmap, strict=True):
        for key in a:
            torch.testing.assert_close(a[key], b[key], rtol=1e-10, atol=1e-12)


def test_the_stack_of_ranks_2_4_8_multiplies_to_the_weighted_mean_of_the_products():
    g = torch.Generator().manual_seed(0)
    a = [torch.randn(r, 5, generator=g) for r in (2, 4, 8)]
    b = [torch.randn(6, r, generator=g) for r in (2, 4, 8)]
    p = [0.5, 0.2, 0.3]
    a_stack, b_stack = stack(a, b, p)
    assert a_stack.shape == (14, 5) and b_stack.shape == (6, 14)
    mean = sum(pk * bk @ ak for pk, ak, bk in zip(p, a, b, strict=True))
    torch.testing.assert_close(b_stack @ a_stack, mean)
    # each factor averaged on its own (FedIT, zero-padded to rank 8) is another matrix
    pad_a = sum(pk * torch.cat([ak, torch.zeros(8 - len(ak), 5)]) for pk, ak in zip(p, a))
    pad_b = sum(pk * torch.cat([bk, torch.zeros(6, 8 - bk.shape[1])], 1) for pk, bk in zip(p, b))
    assert (pad_b @ pad_a - mean).abs().max() > 0.1


def test_bytes_count_each_clients_own_adapter_up_and_the_stack_down():
    algorithm = _flora()
    algorithm.bind_model(Toy())
    params = _start()
    state = algorithm.server_init(params)
    per_rank = (IN + OUT) * 8  # a row of A and a column of B, float64
    bias = OUT * 8
    assert algorithm.message_nbytes(params, state) == (bias, bias)  # nothing stacked yet
    state["parts"]["flora"] = {"stack_rank": torch.tensor(14.0), "sent_rank": torch.tensor(6.0),
                               "cohort": torch.tensor(3.0)}
    down, up = algorithm.message_nbytes(params, state)
    assert down == 6 * per_rank + bias  # the previous round's stack of ranks 2 + 4
    assert up == int(14 / 3 * per_rank) + bias  # ranks 2, 4, 8: their mean per client
    assert algorithm.nbytes_by_round


def test_flora_refuses_a_model_it_cannot_fold_into_in_one_line():
    algorithm = _flora()
    params = _start()
    with pytest.raises(ConfigError, match="model.options.fold_adapters"):
        algorithm.server_init({k: v for k, v in params.items() if k != "l.weight"})
    with pytest.raises(ConfigError, match="model.options.freeze_a"):
        algorithm.server_init({k: v for k, v in params.items() if k != "l.lora_A"})
    with pytest.raises(ConfigError, match="algorithm.ranks: rank 16"):
        build_algorithm("flora", ranks=[16]).server_init(params)
    with pytest.raises(ValueError, match="algorithm.ranks"):
        build_algorithm("flora", ranks=[0, 2])
