"""The round's typed inputs and outputs: RoundDraw (narrowing, default weights, dropout keys)
and CohortMetrics, on hand-computed quadratic rounds (see ``tests/quadratic.py``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedforge.algorithms import build_algorithm
from fedforge.core.store import ClientStore
from fedforge.engine import LoopEngine, VmapEngine, classification_loss
from fedforge.engine.draw import CohortMetrics, RoundDraw
from fedforge.engine.randomness import CLIENT_KEY, client_keys
from fedforge.engine.round import RoundSetup, federated_round, with_preparation
from tests.quadratic import make_clients, quadratic_loss

# client i's one sample [a, b]: grad a (w - b); FedAvg, one step of lr 0.5, server lr 1
ROWS = [[1.0, 1.0, 0.0], [1.0, 0.0, 2.0], [2.0, 4.0, 4.0]]
ENGINES = [LoopEngine, lambda: VmapEngine(chunk_size=2)]


def _setup(engine) -> RoundSetup:
    x_all, y_all = make_clients(ROWS)
    algo = build_algorithm("fedavg", local_lr=0.5)
    return RoundSetup(algo, engine(), quadratic_loss, ClientStore(3, {}), x_all, y_all)


def _draw(agg: list[float] | None, round_: int) -> RoundDraw:
    ids = torch.arange(3)
    agg_t = None if agg is None else torch.tensor(agg, dtype=torch.float64)
    return RoundDraw(ids, ids.view(3, 1, 1), torch.ones(3, 1, 1, dtype=torch.float64), agg_t,
                     counts=torch.tensor([2, 1, 1]), round=round_)


@pytest.mark.parametrize("engine", ENGINES)
def test_two_rounds_the_second_narrowed_to_the_kept_clients(engine):
    setup = _setup(engine)
    params = {"w": torch.zeros(2, dtype=torch.float64)}
    state = setup.algorithm.server_init(params)
    # round 1, weights (1/2, 1/4, 1/4): deltas (-.5, 0), (0, -1), (-4, -4) -> w = (1.25, 1.25)
    params, state, _ = federated_round(setup, params, state, _draw([0.5, 0.25, 0.25], 1))
    torch.testing.assert_close(params["w"], torch.tensor([1.25, 1.25], dtype=torch.float64))
    # round 2, client 0 straggles: the kept weights (1/4, 1/4) become (1/2, 1/2), so
    # deltas (.625, -.375), (-2.75, -2.75) -> w = (2.3125, 2.8125); unnormalised: (1.78, 2.03)
    kept = _draw([0.5, 0.25, 0.25], 2).keep([1, 2])
    assert kept.counts.tolist() == [1, 1] and kept.client_ids.tolist() == [1, 2]
    params, state, cohort = federated_round(setup, params, state, kept)
    torch.testing.assert_close(params["w"], torch.tensor([2.3125, 2.8125], dtype=torch.float64))
    # the typed metrics: each kept client's loss a/2 ||w - b||^2 at w = (1.25, 1.25), one step
    assert isinstance(cohort.metrics, CohortMetrics)
    torch.testing.assert_close(cohort.metrics.loss.double(),
                               torch.tensor([1.0625, 15.125], dtype=torch.float64))
    assert cohort.metrics.steps.tolist() == [1.0, 1.0]
    assert set(cohort.metrics.as_dict()) == {"loss", "steps"}


def test_a_draw_without_weights_averages_uniformly_in_the_model_dtype():
    setup = _setup(LoopEngine)
    params = {"w": torch.zeros(2, dtype=torch.float64)}
    new, _, _ = federated_round(setup, params, setup.algorithm.server_init(params),
                                _draw(None, 1))
    # (-.5 + 0 - 4) / 3, (0 - 1 - 4) / 3, exactly in float64
    torch.testing.assert_close(new["w"], torch.tensor([1.5, 5 / 3], dtype=torch.float64),
                               rtol=0, atol=1e-15)


def test_the_draws_dropout_keys_reach_the_local_update():
    seen = []

    class Spy(LoopEngine):
        def run_cohort(self, algorithm, loss_fn, x_all, y_all, inputs):
            seen.append(inputs.info[CLIENT_KEY].clone())
            return super().run_cohort(algorithm, loss_fn, x_all, y_all, inputs)

    model = nn.Sequential(nn.Linear(4, 3), nn.Dropout(0.5))
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    algo = build_algorithm("fedavg", local_lr=0.1)
    setup = RoundSetup(algo, Spy(), classification_loss(model), ClientStore(3, {}),
                       torch.randn(12, 4), torch.randint(0, 3, (12,)))
    ids = torch.tensor([0, 4, 7])
    draw = RoundDraw(ids, torch.arange(12).view(3, 2, 2), torch.ones(3, 2, 2), round=3)
    for d in (draw.with_keys(11), draw):  # keys of seed 11; none given: those of seed 0
        federated_round(setup, params, algo.server_init(params), d)
    assert seen[0].tolist() == client_keys(11, 3, ids).tolist()
    assert seen[1].tolist() == client_keys(0, 3, ids).tolist() != seen[0].tolist()


def test_cohort_metrics_as_dict_names_only_what_was_reported():
    one = torch.ones(2)
    metrics = CohortMetrics(one, one, parts={"tracking_corr_norm": one},
                            skipped_clients=torch.tensor([3]), robust={"score": one})
    got = metrics.as_dict()
    assert set(got) == {"loss", "steps", "parts", "skipped_clients", "robust_score"}
    assert set(got["parts"]) == {"tracking_corr_norm"}
    assert set(CohortMetrics.empty(one).as_dict()) == {"loss", "steps"}
    assert CohortMetrics.empty(torch.ones(2, dtype=torch.float64)).loss.dtype == torch.float64


def test_preparation_metrics_land_in_their_own_fields_and_unknown_ones_are_refused():
    one = torch.ones(2)
    got = with_preparation(CohortMetrics(one, one), {
        "prep_s": torch.tensor([1.0, 2.0]), "prep_samples": torch.tensor([3.0, 4.0]),
        "server_prep_s": torch.tensor(5.0), "server_prep_samples": torch.tensor(6.0)})
    assert got.prep_s.tolist() == [1.0, 2.0] and got.prep_samples.tolist() == [3.0, 4.0]
    assert float(got.server_prep_s) == 5.0 and float(got.server_prep_samples) == 6.0
    with pytest.raises(ValueError, match=r"unknown \['prep_seconds'\]"):
        with_preparation(CohortMetrics(one, one), {"prep_seconds": one})
