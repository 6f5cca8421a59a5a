"""float64 runs stay float64 end to end, for every registered algorithm.

With ``torch.set_default_dtype(torch.float64)`` a run's data, model, aggregation weights, step
counters, server and client states, uploads and metrics are all float64, and the saved
checkpoint holds no float32 tensor.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedforge.algorithms import ALGORITHMS, build_algorithm
from fedforge.core.store import ClientStore
from fedforge.core.tree import flatten_dict, tree_leaves
from fedforge.engine.local import classification_loss
from fedforge.engine.round import RoundSetup, federated_round
from fedforge.experiment.build import sample_round
from fedforge.experiment.config import load_config
from fedforge.experiment.runner import Experiment

ROOT = Path(__file__).resolve().parents[2]
SLOW = {"fedptr", "fedptr_s"}


@pytest.fixture
def float64_default():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def _floats(tree) -> list[torch.dtype]:
    return [t.dtype for t in tree_leaves(tree) if torch.is_tensor(t) and t.is_floating_point()]


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.slow] if n in SLOW else [])
                                  for n in sorted(ALGORITHMS)])
def test_every_tensor_of_a_float64_run_is_float64(float64_default, name):
    per_round = 6 if "full_participation" in build_algorithm(name).requires else 3  # MARINA
    cfg = load_config(ROOT / "examples/quickstart.toml", [
        "data.options.num_clients=6", f"server.clients_per_round={per_round}",
        "client.local_epochs=null", "client.local_steps=2", f"algorithm.name={name}"])
    exp = Experiment.from_config(cfg)
    loss_fn = classification_loss(exp.network)
    params = exp.initial_params()
    state = exp.algorithm.server_init(params)
    store = ClientStore(exp.data.num_clients, exp.algorithm.client_init(params))
    assert exp.data.train_x.dtype == torch.float64
    for t in (1, 2):
        draw = sample_round(exp, t)  # with n_i: FedNova's weighted uploads
        assert draw.agg_weights.dtype == draw.weights.dtype == torch.float64
        setup = RoundSetup(exp.algorithm, exp.engine, loss_fn, store, exp.data.train_x,
                           exp.data.train_y)
        params, state, cohort = federated_round(setup, params, state, draw)
        seen = {
            "params": _floats(params), "server": _floats(dict(state)),
            "clients": _floats(store.state), "delta": _floats(cohort.mean_delta),
            "uploads": _floats(cohort.mean_uploads),
            "metrics": _floats({"loss": cohort.metrics.loss, "steps": cohort.metrics.steps}),
        }
        leaks = {k: sorted({str(d) for d in v if d != torch.float64}) for k, v in seen.items()}
        assert not any(leaks.values()), f"{name}, round {t}: {leaks}"


def test_scaffold_control_variate_is_exact_for_a_float64_model():
    """A float64 model under the float32 default: c_i+ = (x - x_i) / (K η) with K = 3,
    η = 0.1 is computed in float64 (1/(K η) is not representable in float32)."""
    from fedforge.algorithms import build_algorithm
    from tests.quadratic import run_rounds

    alg = build_algorithm("scaffold", local_lr=0.1)
    _, _, store, _ = run_rounds(alg, [[1.0, 1.0, -2.0]], [0.0, 0.0], rounds=1, steps=3)
    ci = flatten_dict(store.gather(torch.arange(1)))["scaffold/c/w"][0]
    # x_i after 3 steps of x <- x - 0.1 (x - b): x_i = b (1 - 0.9^3)
    b = torch.tensor([1.0, -2.0], dtype=torch.float64)
    want = -(b * (1 - 0.9**3)) / (3 * 0.1)
    assert ci.dtype == torch.float64
    torch.testing.assert_close(ci, want, rtol=1e-15, atol=1e-15)

