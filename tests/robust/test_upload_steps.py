"""A robust aggregator replaces the cohort's mean delta and nothing else. An algorithm whose
server step moves the model from its clients' uploads instead (FedNova's normalised updates,
q-FFL's loss-weighted steps, AFL's λ-weighted ones), or that sends no model (FedProto),
would train as if no aggregator were set, so the config refuses the pair in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedforge.algorithms import ALGORITHMS, build_algorithm
from fedforge.core.store import ClientStore
from fedforge.engine import LoopEngine
from fedforge.engine.draw import RoundDraw
from fedforge.engine.round import RoundSetup, federated_round
from fedforge.experiment.config import ConfigError, load_config
from fedforge.robust.aggregators import AGGREGATORS
from tests.algorithms.multiround import W0, A, B, N
from tests.quadratic import quadratic_loss

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.toml"
REFUSED = sorted(n for n in ALGORITHMS if not build_algorithm(n).steps_on_mean_delta)
ROBUST = sorted(set(AGGREGATORS) - {"mean"})


def test_the_methods_that_step_from_uploads_are_refused():
    assert {"fednova", "qffl", "afl", "fedproto"} <= set(REFUSED)
    assert not {"fedavg", "fedprox", "scaffold", "fedexp", "moon", "fedper"} & set(REFUSED)


@pytest.mark.parametrize("aggregator", ROBUST)
@pytest.mark.parametrize("name", REFUSED)
def test_a_robust_aggregator_is_refused_in_one_line_naming_the_field(name, aggregator):
    with pytest.raises(ConfigError) as err:
        load_config(QUICKSTART, [f"algorithm.name={name}", f"server.aggregator={aggregator}"])
    message = str(err.value)
    assert message == (f"server.aggregator: {aggregator!r} would change nothing for algorithm "
                       f"{name!r}, whose server step does not move the model from the mean "
                       f"delta (the one value a robust aggregator replaces); use "
                       f"server.aggregator = \"mean\"")


@pytest.mark.parametrize("name", ["fedavg", "moon", "scaffold"])
def test_the_mean_and_other_methods_still_load(name):
    assert load_config(QUICKSTART, [f"algorithm.name={name}", "server.aggregator=median"])
    assert load_config(QUICKSTART, ["algorithm.name=fednova", "server.aggregator=mean"])


def _one_round(name: str, robust) -> np.ndarray:
    """One round of three quadratic clients, the cohort's mean delta passed through
    ``robust`` (what a robust aggregator replaces)."""
    algorithm = build_algorithm(name)
    algorithm.bind_population(N)
    params = {"w": torch.tensor(W0, dtype=torch.float64)}
    x = torch.tensor(np.c_[A, B], dtype=torch.float64)
    ids = torch.tensor([0, 1, 2])
    idx = ids.view(-1, 1, 1).expand(-1, 2, 1).clone()
    weights = torch.ones(idx.shape, dtype=torch.float64)
    setup = RoundSetup(algorithm, LoopEngine(), quadratic_loss,
                       ClientStore(N, algorithm.client_init(params)), x,
                       torch.zeros(N, dtype=torch.long), robust=robust)
    params, _, _ = federated_round(setup, params, algorithm.server_init(params),
                                   RoundDraw(ids, idx, weights, counts=torch.ones(3)))
    return params["w"].numpy()


def _doubled(cohort, client_ids, agg_weights, round_):
    return cohort._replace(mean_delta={k: 2 * v for k, v in cohort.mean_delta.items()})


@pytest.mark.parametrize("name", [n for n in REFUSED if build_algorithm(n).sends_model])
def test_the_refused_server_steps_do_not_read_the_mean_delta(name):
    """Why they are refused: another mean delta leaves their step where it was, which it
    does not for FedAvg."""
    assert np.array_equal(_one_round(name, None), _one_round(name, _doubled))
    assert not np.array_equal(_one_round("fedavg", None), _one_round("fedavg", _doubled))
