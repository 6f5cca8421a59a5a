"""The round driver's view for a client sampler, piece by piece on a fake experiment: the
clients it may pick, their steps, samples and expected seconds, the losses it may ask for,
what it is told after a round, and the config checks.

The whole-run tests (test_selection_run.py) use local steps, every client's data and a clock
without a delay law; these cover local epochs, held-out clients, subsampled losses, empty
clients, the device speeds and the delay's mean.
"""

from types import SimpleNamespace as NS

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedforge.errors import ConfigError
from fedforge.schedulers.client_selection import Selection, check_sampler, trainable
from fedforge.sim.cost import CostModel
from fedforge.sim.selection import selection_rng

X = torch.tensor([[0.0], [1.0], [2.0], [-1.0], [3.0], [0.5], [-2.0]])
Y = torch.tensor([0, 1, 1, 0, 1, 0, 1])
INDICES = [torch.tensor([0, 1, 2]), torch.tensor([3, 4, 5, 6]), torch.tensor([], dtype=torch.long)]


class Recorder:
    """A sampler that picks the first m clients and keeps what it was shown."""

    name = "recorder"

    def __init__(self, needs_rms_loss: bool = False) -> None:
        self.needs_rms_loss = needs_rms_loss
        self.pool = self.rng = self.feedback = None

    def select(self, round_, m, pool, rng):
        self.pool, self.rng = pool, rng
        return np.arange(m)

    def observe(self, round_, feedback):
        self.feedback = feedback


def _net() -> nn.Module:
    net = nn.Linear(1, 2)
    with torch.no_grad():
        net.weight.copy_(torch.tensor([[1.0], [-1.0]]))
        net.bias.zero_()
    return net


def _exp(steps=2, epochs=None, held_out=0, per_round=2, batch=2, sizes=(3, 4, 0), extra=0):
    cfg = NS(server=NS(clients_per_round=per_round, sampler="power_of_choice",
                       sampler_options={}),
             client=NS(batch_size=batch, local_steps=steps, local_epochs=epochs),
             eval=NS(batch_size=2, held_out=held_out), seed=11)
    data = NS(client_indices=INDICES + [torch.tensor([0])] * extra, train_x=X, train_y=Y,
              num_clients=len(sizes) + extra)
    return NS(cfg=cfg, client_sizes=torch.tensor(list(sizes) + [1] * extra), data=data,
              network=_net())


def _params(exp) -> dict:
    return {k: v.detach().clone() for k, v in exp.network.named_parameters()}


COST = CostModel(step_time_s=0.5, bandwidth_up_mbps=8.0, bandwidth_down_mbps=16.0,
                 latency_s=0.1)


def _per_sample(rows) -> torch.Tensor:
    """The hand reference: cross-entropy of the float32 logits [x, -x], then in float64."""
    x = X[rows]
    return F.cross_entropy(torch.cat([x, -x], 1), Y[rows], reduction="none").double()


def test_held_out_clients_are_never_candidates():
    exp = _exp(held_out=2, extra=2)
    assert trainable(exp) == 3
    assert Selection(Recorder(), exp, COST, None).sizes.tolist() == [3, 4, 0]


def test_steps_and_samples_with_local_steps():
    sel = Selection(Recorder(), _exp(steps=2, batch=2), COST, None)
    assert sel.steps.dtype == np.float64 and sel.steps.tolist() == [2.0, 2.0, 2.0]
    assert sel.samples.dtype == np.float64 and sel.samples.tolist() == [3.0, 4.0, 0.0]
    sel = Selection(Recorder(), _exp(steps=1, batch=2), COST, None)
    assert sel.samples.tolist() == [2.0, 2.0, 0.0]  # one step of 2 out of 3 and 4


def test_steps_with_local_epochs_are_epochs_times_batches():
    sel = Selection(Recorder(), _exp(steps=None, epochs=2, batch=2), COST, None)
    assert sel.steps.tolist() == [4.0, 4.0, 0.0]  # 2 x ceil(3 / 2), 2 x ceil(4 / 2)
    assert sel.samples.tolist() == [3.0, 4.0, 0.0]


def test_expected_seconds_scale_by_speed_and_the_delay_s_mean():
    base = [COST.client_seconds(2.0, 1e6, 2e5)] * 3
    sel = Selection(Recorder(), _exp(), COST, None)
    assert sel.expected_seconds(1e6, 2e5).tolist() == pytest.approx(base)
    clock = NS(pop=NS(speed=[1.0, 2.0, 4.0, 8.0]), delay=NS(shift=0.5))
    sel = Selection(Recorder(), _exp(), COST, clock)
    assert sel.expected_seconds(1e6, 2e5).tolist() == pytest.approx(
        [b * s * 1.5 for b, s in zip(base, (1.0, 2.0, 4.0), strict=True)])
    sel = Selection(Recorder(), _exp(), COST, NS(pop=NS(speed=[3.0, 1.0, 1.0]), delay=NS()))
    assert sel.mean_factor == 1.0 and sel.speed.dtype == np.float64


def test_the_pool_and_rng_the_sampler_is_shown():
    exp, rec = _exp(per_round=5), Recorder()
    sel = Selection(rec, exp, COST, None)
    ids = sel.choose(4, _params(exp), 1e6, 2e5)
    assert ids.dtype == torch.int64 and ids.tolist() == [0, 1, 2]  # m = min(5, 3)
    assert rec.pool.sizes.tolist() == [3, 4, 0] and rec.pool.samples.tolist() == [3, 4, 0]
    assert rec.pool.durations.tolist() == pytest.approx(sel.expected_seconds(1e6, 2e5).tolist())
    assert rec.rng.random() == selection_rng(11, 4).random()
    rng_a, rng_b = np.random.default_rng(5), np.random.default_rng(5)
    got = rec.pool.losses(np.array([1]), 2, rng_a)
    assert got.tolist() == sel.losses(_params(exp), np.array([1]), 2, rng_b)[0].tolist()


def test_losses_on_all_samples_and_an_empty_client():
    exp = _exp()
    mean, rms = Selection(Recorder(), exp, COST, None).losses(_params(exp), np.array([0, 2]))
    per = _per_sample(INDICES[0])
    assert mean.tolist() == pytest.approx([float(per.mean()), 0.0], abs=1e-12)
    assert rms.tolist() == pytest.approx([float(per.square().mean().sqrt()), 0.0], abs=1e-12)


def test_losses_on_a_batch_drawn_without_replacement():
    exp = _exp()
    rows = np.sort(np.random.default_rng(3).choice(4, size=3, replace=False))
    mean, _ = Selection(Recorder(), exp, COST, None).losses(
        _params(exp), np.array([1]), 3, np.random.default_rng(3))
    assert mean[0] == pytest.approx(float(_per_sample(INDICES[1][rows]).mean()), abs=1e-12)


def test_losses_on_given_indices():
    exp = _exp()
    sel = Selection(Recorder(), exp, COST, None)
    mean, _ = sel.losses(_params(exp), np.array([1]), indices=[torch.tensor([6])])
    assert mean[0] == pytest.approx(float(_per_sample(torch.tensor([6]))[0]), abs=1e-12)


@pytest.mark.parametrize("needs_rms", [False, True])
def test_what_a_sampler_is_told_after_a_round(needs_rms):
    exp, rec = _exp(), Recorder(needs_rms)
    sel = Selection(rec, exp, COST, None)
    idx = torch.tensor([[[0, 1], [2, 0]], [[3, 4], [5, 6]]])
    weights = torch.tensor([[[1.0, 1.0], [1.0, 0.0]], [[0.5, 0.0], [0.0, 0.0]]])
    sel.observe(2, _params(exp), torch.tensor([0, 1]), idx, weights,
                torch.tensor([0.25, 0.75]), np.array([3.0, 4.0]))
    fb = rec.feedback
    assert fb.ids.tolist() == [0, 1] and fb.train_loss.tolist() == [0.25, 0.75]
    assert fb.samples.dtype == np.float64 and fb.samples.tolist() == [3.0, 1.0]
    assert fb.durations.tolist() == [3.0, 4.0]
    expected = ([float(_per_sample(torch.tensor(r)).square().mean().sqrt())
                 for r in ([0, 1, 2], [3])] if needs_rms else [0.0, 0.0])
    assert fb.rms_loss.tolist() == pytest.approx(expected, abs=1e-12)


def test_a_participant_s_seconds_count_the_steps_it_took():
    """Two of three steps hold a sample (one of weight 1/4); three batch columns do."""
    sel = Selection(Recorder(), _exp(), COST, None)
    weights = torch.tensor([[[0.25, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]],
                            [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]])
    got = sel.client_seconds(torch.tensor([0, 1]), weights, 1e6, 2e5)
    assert got.tolist() == pytest.approx([COST.client_seconds(2.0, 1e6, 2e5),
                                          COST.client_seconds(0.0, 1e6, 2e5)])


def test_build_keeps_the_clock_and_uniform_builds_nothing():
    exp, clock = _exp(), NS(pop=NS(speed=[1.0, 1.0, 1.0]), delay=NS())
    assert Selection.build(exp, COST, clock).clock is clock
    exp.cfg.server.sampler = "uniform"
    assert Selection.build(exp, COST, clock) is None


def _cfg(sampler, privacy=False, dataset="synthetic"):
    return NS(server=NS(sampler=sampler, sampler_options={}, clients_per_round=2),
              client=NS(batch_size=4), privacy=NS(on=privacy), data=NS(dataset=dataset))


def test_uniform_goes_with_everything():
    check_sampler(_cfg("uniform", privacy=True, dataset="synthetic_population"))


def test_a_sampler_is_refused_with_privacy_and_with_a_generated_population():
    with pytest.raises(ConfigError) as err:
        check_sampler(_cfg("oort", privacy=True))
    assert str(err.value) == ("server.sampler: 'oort' picks clients by what they report, which "
                              "differential privacy's Poisson sampling and its accounting do "
                              "not allow; use 'uniform'")
    with pytest.raises(ConfigError) as err:
        check_sampler(_cfg("power_of_choice", dataset="synthetic_population"))
    assert str(err.value) == ("server.sampler: 'power_of_choice' keeps a record per client, and "
                              "'synthetic_population' generates each client's data when the "
                              "client is drawn; use 'uniform'")
