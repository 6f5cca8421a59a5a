"""FedExP: the server step size on hand examples, the evaluation point, ε as a schedule.

Clients are the quadratics of ``tests/quadratic.py`` with ``a = 1`` and one SGD step of lr 1
from ``x = 0``: ``x_i = b_i``, so ``Δ_i = x - x_i = -b_i`` and every number is by hand.
"""

import pytest
import torch

from fedforge.algorithms import build_algorithm
from fedforge.algorithms.fedexp import fedexp_step_size
from tests.quadratic import ENGINES, run_rounds

F64 = torch.float64


def test_step_size_hand_example():
    """Δ_1 = (1, 0), Δ_2 = (-1, 2): Δ̄ = (0, 1), mean ||Δ_i||² = (1 + 5) / 2 = 3.

    η = max(1, ½ · 3 / (1 + 2ε)): 1.5 at ε = 0, 1.5 / 1.1 at ε = 0.05, 1 at ε = 0.25.
    """
    mean_delta = {"w": torch.tensor([0.0, 1.0], dtype=F64)}
    sq = torch.tensor(3.0, dtype=F64)
    assert float(fedexp_step_size(sq, mean_delta, 2, 0.0)) == pytest.approx(1.5)
    assert float(fedexp_step_size(sq, mean_delta, 2, 0.05)) == pytest.approx(1.5 / 1.1)
    assert float(fedexp_step_size(sq, mean_delta, 2, 0.25)) == 1.0


def test_step_size_is_one_when_clients_agree_or_all_deltas_vanish():
    d = {"w": torch.tensor([0.3, -0.4], dtype=F64)}
    # identical Δ_i: ½ ||Δ||² / ||Δ||² = ½ -> clamped to 1
    assert float(fedexp_step_size(torch.tensor(0.25, dtype=F64), d, 5, 0.0)) == 1.0
    zero = {"w": torch.zeros(2, dtype=F64)}
    assert float(fedexp_step_size(torch.tensor(0.0, dtype=F64), zero, 5, 0.0)) == 1.0


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_round_uses_extrapolated_step(engine):
    # b_1 = (-1, 0), b_2 = (1, -2)  ->  Δ_1 = (1, 0), Δ_2 = (-1, 2), η = 1.5 (see above)
    rows = [[1.0, -1.0, 0.0], [1.0, 1.0, -2.0]]
    alg = build_algorithm("fedexp", local_lr=1.0, eps=0.0)
    params, state, _, _ = run_rounds(alg, rows, [0.0, 0.0], engine=ENGINES[engine]())
    torch.testing.assert_close(params["w"], torch.tensor([0.0, -1.5], dtype=F64))
    assert float(state["opt"]["eta_g"]) == pytest.approx(1.5)


def test_agreeing_clients_give_fedavg():
    rows = [[1.0, 0.5, 2.0], [1.0, 0.5, 2.0]]
    exp = build_algorithm("fedexp", local_lr=0.3, eps=0.0)
    avg = build_algorithm("fedavg", local_lr=0.3)
    p_exp, s_exp, _, _ = run_rounds(exp, rows, [1.0, -1.0], rounds=2, steps=2)
    p_avg, _, _, _ = run_rounds(avg, rows, [1.0, -1.0], rounds=2, steps=2)
    torch.testing.assert_close(p_exp["w"], p_avg["w"])
    assert float(s_exp["opt"]["eta_g"]) == 1.0


def test_evaluation_at_average_of_last_two_iterates():
    rows = [[1.0, -1.0, 0.0], [1.0, 1.0, -2.0]]
    alg = build_algorithm("fedexp", local_lr=1.0, eps=0.0)
    _, _, _, hist = run_rounds(alg, rows, [0.0, 0.0], rounds=2)
    (x1, s1, _), (x2, s2, _) = hist
    # after round 1 the code evaluates x^1 itself; afterwards (x^t + x^{t-1}) / 2
    torch.testing.assert_close(alg.eval_params(x1, s1)["w"], x1["w"])
    torch.testing.assert_close(alg.eval_params(x2, s2)["w"], 0.5 * (x1["w"] + x2["w"]))
    assert not torch.equal(x1["w"], x2["w"])
    # any other algorithm is evaluated where it stands
    avg = build_algorithm("fedavg")
    assert avg.eval_params(x2, s2) is x2


def test_eps_schedule_follows_the_server_round():
    """ε_t = 0.1 · 0.5^t: round 1 ε = 0.05 -> η = 1.5/1.1; round 2 uses ε = 0.025."""
    rows = [[1.0, -1.0, 0.0], [1.0, 1.0, -2.0]]
    alg = build_algorithm("fedexp", local_lr=1.0,
                          eps={"schedule": "exponential", "init": 0.1, "gamma": 0.5})
    _, _, _, hist = run_rounds(alg, rows, [0.0, 0.0], rounds=2)
    assert float(hist[0][1]["opt"]["eta_g"]) == pytest.approx(1.5 / 1.1)
    x1 = hist[0][0]["w"]  # round 2 from x1: Δ_i = x1 - b_i
    d = torch.stack([x1 - torch.tensor([-1.0, 0.0], dtype=F64),
                     x1 - torch.tensor([1.0, -2.0], dtype=F64)])
    want = max(1.0, 0.5 * float((d**2).sum(1).mean()) / (float((d.mean(0) ** 2).sum()) + 2 * 0.025))
    assert float(hist[1][1]["opt"]["eta_g"]) == pytest.approx(want)
