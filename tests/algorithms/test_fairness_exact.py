"""q-FFL's and AFL's pieces on their own, by hand, in float64: the start loss F_k(x^t), its
timing metrics, each client's uploads, the server steps and AFL's λ diagnostics.

The four-round references (test_multiround_baselines.py) use a loss that ignores y, one
sample per step and a model without dropout, so they cannot see how F_k weighs batches of
different masses, skips padding, reads the labels or switches dropout off; their model has
one float64 leaf, so they cannot see a leaf of another dtype change it either.
"""

import math
from types import SimpleNamespace

import pytest
import torch

from fedforge.algorithms import build_algorithm, fairness
from fedforge.algorithms.fairness import (
    START_LOSS,
    MixtureWeights,
    QFairUpdate,
    StartLoss,
    afl_step,
    qffl_step,
    start_losses,
)
from fedforge.client.transforms import RoundContext
from fedforge.protocol.algorithm import (
    CLIENT_ID,
    PREP_SAMPLES,
    PREP_SECONDS,
    FinalizeInputs,
    PrepareInputs,
)
from fedforge.server.chain import Aggregate

F64, F32 = torch.float64, torch.float32


# ------------------------------------------------------------------------------ start loss
class DropoutLoss:
    """The masked mean of (model(w x) - y)²: a loss that reads y, whose model is a dropout
    layer with p = 1 (everything zeroed in training mode, the identity in eval mode)."""

    def __init__(self, training: bool) -> None:
        self.model = torch.nn.Dropout(p=1.0)
        self.model.train(training)
        self.seen: list[bool] = []  # the model's mode at each call

    def __call__(self, params, x, y, w):
        self.seen.append(self.model.training)
        per_sample = (self.model(params["w"] * x) - y) ** 2
        return (per_sample * w).sum() / w.sum().clamp_min(1.0)


# x, y: at w = 2 the per-sample losses (2x - y)² are 4, 9, 25, 9 (y² = 0, 1, 1, 25 with dropout)
X, Y = [1.0, 2.0, 3.0, 4.0], [0.0, 1.0, 1.0, 5.0]
# client 0: a batch of mass 2, a padding step, then a batch of mass 1; client 1: no data.
# [C=2, steps=3, batch=2], so a mix-up of the cohort, step and batch axes shows.
IDX = [[[0, 1], [2, 3], [2, 3]], [[0, 1], [0, 1], [0, 1]]]
W = [[[1.0, 1.0], [0.0, 0.0], [1.0, 0.0]], [[0.0, 0.0]] * 3]
F0 = (6.5 * 2 + 25 * 1) / 3  # the batches' losses weighted by their masses


def _prep(loss_fn, idx=IDX, w=W, data=F64, requires_grad=False):
    x = {"w": torch.tensor(2.0, dtype=F64, requires_grad=requires_grad)}
    sample_idx = torch.tensor(idx, dtype=torch.long).reshape(-1, 3, 2)
    weights = torch.tensor(w, dtype=data).reshape(-1, 3, 2)
    return PrepareInputs(x, {"round": torch.tensor(1.0, dtype=F64)}, {}, {}, loss_fn,
                         torch.tensor(X, dtype=data), torch.tensor(Y, dtype=data),
                         sample_idx, weights)


def test_the_start_loss_weighs_batches_by_mass_and_skips_padding():
    """F_k = Σ_steps mass · loss / Σ mass over the steps that hold data (a padding step in
    between is skipped, not an end); a client without data has F_k = 0."""
    out = start_losses(_prep(DropoutLoss(training=False), requires_grad=True))
    assert out.shape == (2,) and out.dtype == F64 and not out.requires_grad
    assert out.tolist() == pytest.approx([F0, 0.0], abs=1e-14)


@pytest.mark.parametrize("training", [True, False])
def test_the_start_loss_switches_dropout_off_and_restores_the_mode(training):
    """Evaluated in eval mode (a training-mode dropout would give the y² instead), then the
    model's own mode is put back, for the local training that follows."""
    loss_fn = DropoutLoss(training)
    out = start_losses(_prep(loss_fn))
    assert loss_fn.seen == [False, False]  # the two batches of client 0
    assert out.tolist() == pytest.approx([F0, 0.0], abs=1e-14)
    assert loss_fn.model.training is training


def test_a_loss_without_a_model_is_evaluated_as_it_is():
    """A plain function has no model to switch (the quadratic test losses)."""
    loss_fn = DropoutLoss(training=False)
    out = start_losses(_prep(lambda *args: loss_fn(*args)))
    assert out.tolist() == pytest.approx([F0, 0.0], abs=1e-14)


def test_the_start_loss_is_in_the_models_dtype():
    """float32 data and loss under a float64 model: F_k comes back in float64."""
    out = start_losses(_prep(DropoutLoss(False), data=F32))
    assert out.dtype == F64
    assert out.tolist() == pytest.approx([F0, 0.0], rel=1e-6)


def test_an_empty_cohort_has_no_start_losses():
    """No clients: an empty [0] vector in the model's dtype (nothing to stack)."""
    model = DropoutLoss(training=True)
    out = start_losses(_prep(model, idx=[], w=[]))
    assert out.shape == (0,) and out.dtype == F64 and model.model.training


@pytest.mark.parametrize("clients, seconds", [(2, 3.0), (1, 6.0)])
def test_start_loss_reports_its_seconds_per_client(monkeypatch, clients, seconds):
    """The wall time (here 6 s, from a patched clock) split over the cohort, in float64; no
    gradient samples (forward passes only); the losses go into the round's info."""
    ticks = iter([10.0, 16.0])
    monkeypatch.setattr(fairness, "time", SimpleNamespace(perf_counter=lambda: next(ticks)))
    prep = _prep(DropoutLoss(False), idx=IDX[:clients], w=W[:clients])
    state, info, metrics = StartLoss().prepare_cohort(prep)
    assert state == {} and list(info) == [START_LOSS]
    assert info[START_LOSS].tolist() == pytest.approx([F0, 0.0][:clients], abs=1e-14)
    assert metrics[PREP_SECONDS].tolist() == [seconds] * clients
    assert metrics[PREP_SAMPLES].tolist() == [0.0] * clients
    assert metrics[PREP_SECONDS].dtype == F64 and metrics[PREP_SAMPLES].dtype == F64


# ----------------------------------------------------------------------------------- q-FFL
def _ctx(info, broadcast=None):
    x = {"w": torch.zeros(2, dtype=F64)}
    return RoundContext(x, {"round": torch.tensor(1.0, dtype=F64), **(broadcast or {})}, {}, info)


def _mixed(w, s):
    """A model of a float64 vector and a float32 scalar (e.g. a learned temperature)."""
    return {"w": torch.tensor(w, dtype=F64), "s": torch.tensor(s, dtype=F32)}


def test_a_qffl_client_uploads_its_weighted_step_and_h_by_hand():
    """q = 2, η = 0.5 (L = 2), F = 3: Δw = 2 δ = ([2, -4], 1), ||Δw||² = 21,
    Δ = F² Δw = 9 Δw, h = q F ||Δw||² + L F² = 126 + 18; each leaf keeps its dtype."""
    delta = _mixed([1.0, -2.0], 0.5)
    fin = FinalizeInputs(_ctx({START_LOSS: torch.tensor(3.0, dtype=F64)}), delta, delta, {},
                         None, torch.tensor(3))
    state, up = QFairUpdate(2.0, 0.5).finalize(fin)
    assert state == {}
    assert up["delta"]["w"].tolist() == pytest.approx([18.0, -36.0], rel=1e-9)
    assert up["delta"]["s"].item() == pytest.approx(9.0, rel=1e-7)
    assert up["delta"]["w"].dtype == F64 and up["delta"]["s"].dtype == F32
    assert up["h"].item() == pytest.approx(144.0, rel=1e-9) and up["h"].dtype == F64


def test_a_bad_local_rate_is_named_by_its_field():
    with pytest.raises(ValueError, match=r"^local_lr: "):
        QFairUpdate(2.0, True)


def _agg(uploads):
    return Aggregate({}, uploads, 2, 5, 1)


def test_the_qffl_server_step_by_hand():
    """x <- x - Σ Δ / Σ h, in each leaf's dtype (the float32 scalar stays float32)."""
    params = _mixed([1.0, 1.0], 2.0)
    up = {"delta": _mixed([18.0, -36.0], 9.0), "h": torch.tensor(144.0, dtype=F64)}
    new, _, state = qffl_step().update(params, _agg({"qffl": up}), {})
    assert new["w"].tolist() == [0.875, 1.25] and new["w"].dtype == F64
    assert new["s"].item() == 1.9375 and new["s"].dtype == F32


@pytest.mark.parametrize("name, opt_keys", [("qffl", []), ("afl", ["avg", "count"])])
def test_the_server_stage_is_named_opt_and_never_reads_the_mean_delta(name, opt_keys):
    """``server["opt"]`` is where every server optimizer keeps its state (q-FFL: none), so a
    checkpoint reads like theirs; the stage steps on the uploads, so a robust aggregator,
    which replaces the mean delta, is refused."""
    algo = build_algorithm(name)
    algo.bind_population(3)
    state = algo.server_init({"w": torch.zeros(2, dtype=F64)})
    assert list(state) == ["opt", "parts"] and list(state["opt"]) == opt_keys
    assert isinstance(state["opt"], dict)
    assert [stage.name for stage in algo.server.stages] == ["opt", "parts"]
    assert not algo.steps_on_mean_delta


# ------------------------------------------------------------------------------------- AFL
def test_afl_needs_the_population_before_its_state():
    with pytest.raises(ValueError) as err:
        MixtureWeights(0.1).server_init({"w": torch.zeros(2)})
    assert str(err.value) == ("algorithm 'afl': the number of clients is unknown; call "
                              "Algorithm.bind_population(N) before server_init (runs do)")


def test_afl_starts_from_uniform_weights_in_the_models_dtype():
    part = MixtureWeights(0.1)
    part.bind_population(4)
    lam = part.server_init({"w": torch.zeros(2, dtype=F64)})["lam"]
    assert lam.tolist() == [0.25] * 4 and lam.dtype == F64


def test_an_afl_client_uploads_n_lambda_delta_and_its_loss_by_hand():
    """Client 1 of N = 3 with λ_1 = 0.6, F = 2: N λ_1 δ = 1.8 δ and F e_1; each leaf keeps
    its dtype."""
    lam = torch.tensor([0.1, 0.6, 0.3], dtype=F64)
    ctx = _ctx({CLIENT_ID: torch.tensor(1), START_LOSS: torch.tensor(2.0, dtype=F64)},
               {"afl": {"lam": lam}})
    delta = _mixed([1.0, -2.0], 0.5)
    state, up = MixtureWeights(0.1).finalize(FinalizeInputs(ctx, delta, delta, {}, None,
                                                            torch.tensor(3)))
    assert state == {}
    assert up["delta"]["w"].tolist() == pytest.approx([1.8, -3.6], rel=1e-12)
    assert up["delta"]["s"].item() == pytest.approx(0.9, rel=1e-7)
    assert up["delta"]["w"].dtype == F64 and up["delta"]["s"].dtype == F32
    assert up["loss"].tolist() == [0.0, 2.0, 0.0] and up["loss"].dtype == F64


def test_afl_logs_the_largest_weight_and_the_entropy():
    """max λ and -Σ λ log λ with 0 log 0 = 0: ln 2 over two of four clients, ln 4 uniform."""
    part = MixtureWeights(0.1)
    for lam, entropy in (([0.5, 0.5, 0.0, 0.0], math.log(2)), ([0.25] * 4, math.log(4))):
        got = part.server_metrics({"lam": torch.tensor(lam, dtype=F64)}, {})
        assert sorted(got) == ["afl_lambda_entropy", "afl_lambda_max"]
        assert got["afl_lambda_max"].item() == max(lam)
        assert got["afl_lambda_entropy"].item() == pytest.approx(entropy, rel=1e-15)


def test_the_afl_server_step_keeps_the_mean_of_the_iterates_by_hand():
    """x <- x - η_g mean(N λ δ) with η_g = 0.5; evaluated at the mean of x^1..x^t (not x^0),
    its counter and every leaf in the model's dtypes."""
    step = afl_step(0.5, average=True)
    params = _mixed([0.0, 0.0], 1.0)
    state = step.init(params)
    assert state["count"].item() == 0 and state["count"].dtype == F64
    iterates = []
    for up in (_mixed([2.0, -2.0], 1.0), _mixed([2.0, 0.0], 1.0)):
        params, _, state = step.update(params, _agg({"afl": {"delta": up}}), state)
        iterates.append(params)
    assert iterates[0]["w"].tolist() == [-1.0, 1.0] and iterates[0]["s"].item() == 0.5
    assert iterates[1]["w"].tolist() == [-2.0, 1.0] and iterates[1]["s"].item() == 0.0
    avg = step.eval_params(params, state)
    assert avg["w"].tolist() == [-1.5, 1.0] and avg["s"].item() == 0.25
    assert avg["w"].dtype == F64 and avg["s"].dtype == F32 and params["s"].dtype == F32
    assert state["count"].item() == 2 and state["count"].dtype == F64
