"""FedNova's pieces on their own, by hand: the normaliser's count, its dtype, what a client
uploads, and the names its stages go by.

The four-round references (test_multiround_baselines.py) check the trajectory, which cannot
see a normaliser scaled by the same factor in every client: τ_eff Σ p_i Δ_i / ||a_i||_1 does
not change. The uploads d_i and τ_i, which the logs and a robust rule would read, do.
"""

import pytest
import torch

from fedforge.algorithms import build_algorithm
from fedforge.algorithms.fednova import NORM, NormalisedUpdate, local_normaliser
from fedforge.client.transforms import RoundContext
from fedforge.protocol.algorithm import FinalizeInputs

F64 = torch.float64


def _ctx(params):
    return RoundContext(params, {"round": torch.tensor(1.0, dtype=F64)}, {}, {})


def _count(steps: int, momentum: float = 0.0, mu: float = 0.0, lr: float = 0.1):
    x = {"w": torch.zeros(2, dtype=F64)}
    t = local_normaliser(momentum, mu, lr)
    state = t.init(x, _ctx(x))
    for _ in range(steps):
        grads = {"w": torch.tensor([1.0, -2.0], dtype=F64)}
        out, state = t.update(grads, state, x, _ctx(x))
        assert out is grads  # the gradient passes through untouched
    return state


@pytest.mark.parametrize("momentum, mu, expected", [
    (0.0, 0.0, 3.0),  # plain SGD: ||a_i||_1 = τ_i
    (0.5, 0.0, 1 + 1.5 + 1.75),  # c <- ρ c + 1, a <- a + c
    (0.0, 0.3, (1 * 0.97 + 1) * 0.97 + 1),  # a <- (1 - η μ) a + 1, η = 0.1
])
def test_the_normaliser_counts_as_the_official_code(momentum, mu, expected):
    state = _count(3, momentum, mu)
    assert state["norm"].item() == pytest.approx(expected, abs=1e-15)
    assert state["norm"].dtype == F64 and state["counter"].dtype == F64  # the params' dtype


def test_the_normaliser_keeps_no_parameters_and_only_counts():
    assert local_normaliser(0.0, 0.0, 0.1).keeps_params is False


def test_a_bad_local_rate_is_named_by_its_field():
    with pytest.raises(ValueError, match=r"^local_lr: "):
        local_normaliser(0.0, 0.3, True)


def _finalize(norm: float, steps: int, count_steps: bool):
    x = {"w": torch.tensor([2.0, -4.0], dtype=F64)}
    fin = FinalizeInputs(_ctx(x), x, x, {NORM: {"norm": torch.tensor(norm, dtype=F64)}}, None,
                         torch.tensor(steps))
    return NormalisedUpdate(count_steps).finalize(fin)


def test_a_client_uploads_its_delta_over_the_normaliser_and_its_tau():
    state, up = _finalize(4.0, 3, count_steps=False)
    assert state == {}
    assert torch.equal(up["d"]["w"], torch.tensor([0.5, -1.0], dtype=F64))
    assert up["tau"].item() == 4.0  # ||a_i||_1
    _, up = _finalize(4.0, 3, count_steps=True)  # μ > 0: the code's τ_eff counts steps
    assert up["tau"].item() == 3 and up["tau"].dtype == F64


def test_a_client_without_steps_uploads_zeros():
    x = {"w": torch.zeros(2, dtype=F64)}
    fin = FinalizeInputs(_ctx(x), x, x, {NORM: {"norm": torch.zeros((), dtype=F64)}}, None,
                         torch.tensor(0))
    _, up = NormalisedUpdate(False).finalize(fin)
    assert torch.equal(up["d"]["w"], torch.zeros(2, dtype=F64)) and up["tau"].item() == 0


def test_the_server_stage_is_named_opt_and_never_reads_the_mean_delta():
    """``server["opt"]`` is where every server optimizer keeps its state (FedAvgM's buffer
    too), so a FedNova checkpoint reads like theirs; a robust aggregator is refused because
    the stage steps on the uploads, not on the mean delta."""
    algo = build_algorithm("fednova", server_momentum=0.5)
    x = {"w": torch.zeros(2)}
    assert list(algo.server_init(x)) == list(build_algorithm("fedavgm").server_init(x))
    assert [stage.name for stage in algo.server.stages] == ["opt", "parts"]
    assert algo.server.stages[0].reads_delta is False
