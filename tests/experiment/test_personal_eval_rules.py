"""The personalised evaluation's rules, each on a problem small enough to work out by hand:
which data each client is scored on, one-step fine-tuning, the seen clients' stored state
against the held-out clients' global start, chunks of clients, and the round the
fine-tuning optimizer reads.

The models are logistic regressions whose predictions are known without running them: all
logits equal (zero parameters) predict class 0, a bias of 10 on class c predicts c, and one
SGD step from zero on samples of class 2 with positive features predicts class 2."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedforge.algorithms import build_algorithm
from fedforge.core.store import ClientStore
from fedforge.data.client_split import client_split
from fedforge.data.federated import FederatedDataset
from fedforge.engine import classification_loss
from fedforge.engine.randomness import RandomLayerError
from fedforge.experiment.metrics import PER_CLIENT
from fedforge.experiment.personal_eval import (
    evaluate_personal,
    finetune,
    personal_data,
    stack,
    summarise,
)
from fedforge.models import build_model

DIM, CLASSES = 2, 3


def _data(sizes, labels=None, seed=0) -> FederatedDataset:
    """Clients of ``sizes`` samples with positive features; ``labels`` all samples' labels
    (default: random classes)."""
    gen = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    x = torch.rand(n, DIM, generator=gen) + 0.1
    y = torch.randint(0, CLASSES, (n,), generator=gen) if labels is None else labels
    bounds = torch.tensor([0, *sizes]).cumsum(0).tolist()
    parts = [torch.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    return FederatedDataset(x, y, x[:2], y[:2], parts, None, CLASSES, (DIM,), "toy")


def _zeros(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: torch.zeros_like(v) for k, v in model.named_parameters()}


def _kw(**over):
    kw = dict(held_out_steps=0, batch_size=64, train_batch_size=2, seed=0, round_=1)
    return {**kw, **over}


# --- summarise -------------------------------------------------------------------------

def test_a_client_with_one_test_sample_counts():
    got = summarise("p", torch.tensor([1.0, 0.0, 0.5]), torch.tensor([1.0, 3.0, 0.0]))
    assert got == {"p_mean": 0.5, "p_weighted": 0.25, "p_p10": pytest.approx(0.1),
                   "p_worst": 0.0, "p_var": 0.25}  # over clients, not samples, ddof 0


# --- personal_data: what each client is scored on ------------------------------------

def test_the_protocol_is_on_by_default_for_personalised_methods_only():
    data = _data([8, 4, 6])
    fedavg, fedper = build_algorithm("fedavg"), build_algorithm("fedper")
    kw = dict(fraction=0.5, held_out=0, finetune_steps=0, seed=3, natural=False)
    assert personal_data(data, fedavg, on=None, **kw) == (data, None)
    assert personal_data(data, fedper, on=False, **kw) == (data, None)
    for algorithm in (fedper, fedavg):  # on: the default of fedper, asked for with fedavg
        split, tests = personal_data(data, algorithm, on=None if algorithm is fedper else True,
                                     **kw)
        assert [len(p) for p in split.client_indices] == [4, 2, 3]  # half of each held out
        assert [len(t) for t in tests.indices] == [4, 2, 3]
        assert tests.held_out.tolist() == []


def test_personal_data_passes_fraction_seed_held_out_and_natural_on():
    data = _data([8, 4, 6, 4])
    fedper = build_algorithm("fedper")
    _, tests = personal_data(data, fedper, on=None, fraction=0.5, held_out=1,
                             finetune_steps=2, seed=7, natural=False)
    _, want = client_split(data, 0.5, 7, 1, False)
    assert tests.held_out.tolist() == [3]
    assert [t.tolist() for t in tests.indices] == [t.tolist() for t in want.indices]
    assert [t.tolist() for t in tests.indices] != [
        t.tolist() for t in client_split(data, 0.5, 8, 1, False)[1].indices]
    data.client_test_indices = [torch.tensor([0]), torch.tensor([1]), torch.tensor([0, 1]),
                                torch.tensor([], dtype=torch.int64)]
    split, tests = personal_data(data, fedper, on=None, fraction=0.5, held_out=0,
                                 finetune_steps=0, seed=7, natural=True)
    assert tests.x is data.test_x and [t.tolist() for t in tests.indices] == [[0], [1], [0, 1], []]
    assert [len(p) for p in split.client_indices] == [8, 4, 6, 4]  # nothing held out of training


@pytest.mark.parametrize(("name", "on", "held_out", "message"), [
    ("fedper", False, 1, "eval.finetune_steps: needs the personalised evaluation "
                         "(eval.personal = true, or a personalised algorithm)"),
    ("fedavg", None, 1, "eval.finetune_steps: needs the personalised evaluation "
                        "(eval.personal = true, or a personalised algorithm)"),
    ("fedavg", True, 0, "eval.finetune_steps: 'fedavg' has no personal model to fine-tune; "
                        "use its personalised form (e.g. fedavg_ft)"),
    ("fedper", True, 0, "eval.finetune_steps: fine-tunes the held-out clients; set "
                        "eval.held_out to how many of the highest ids never train"),
])
def test_finetune_steps_is_refused_in_one_line(name, on, held_out, message):
    with pytest.raises(ValueError) as err:
        personal_data(_data([8, 4, 6]), build_algorithm(name), on=on, fraction=0.25,
                      held_out=held_out, finetune_steps=2, seed=0, natural=False)
    assert str(err.value) == message


# --- fine-tuning: one step, the round, padding -----------------------------------------

def _one_step_from_zero(lr: float, xbar: torch.Tensor) -> dict[str, torch.Tensor]:
    """One SGD step of ``lr`` from zero parameters on samples of class 2 whose features
    average ``xbar``: the cross-entropy gradient is (1/3 - [c = 2]) per class, times x."""
    g = torch.full((CLASSES,), 1 / 3)
    g[2] -= 1.0
    return {"linear.weight": -lr * g[:, None] * xbar[None, :], "linear.bias": -lr * g}


@pytest.mark.parametrize(("round_", "lr"), [(2, 1.0), (4, 0.5)])
def test_finetuning_reads_the_runs_round(round_, lr):
    # a step schedule: lr 1 before round 3, 0.5 from it; a client's batch is its whole
    # training set (2 samples, batch 2), so one step is its mean gradient
    data = _data([4, 4], labels=torch.full((8,), 2))
    split, tests = client_split(data, 0.5, seed=0)
    model = build_model("logreg", (DIM,), CLASSES)
    tuned = build_algorithm("fedavg_ft", local_lr={"kind": "step", "init": 1.0, "factor": 0.5,
                                                   "milestones": [3]}, finetune_steps=1)
    ids = torch.tensor([0, 1])
    got = finetune(tuned.personal.finetuner(), classification_loss(model),
                   stack(_zeros(model), 2), ids, tests, split.train_x, split.train_y, 1, 2,
                   torch.Generator().manual_seed(0), round_)
    for c in (0, 1):
        xbar = split.train_x[split.client_indices[c]].mean(0)
        want = _one_step_from_zero(lr, xbar)
        for k in want:
            torch.testing.assert_close(got[k][c], want[k])


def test_a_client_without_training_samples_keeps_its_model():
    # with weight decay a padded step would still shrink the parameters
    data = _data([4, 0, 4], labels=torch.full((8,), 2))
    split, tests = client_split(data, 0.5, seed=0)
    model = build_model("logreg", (DIM,), CLASSES)
    tuned = build_algorithm("fedavg_ft", local_lr=0.5, weight_decay=0.5, finetune_steps=3)
    start = stack({k: torch.ones_like(v) for k, v in _zeros(model).items()}, 3)
    got = finetune(tuned.personal.finetuner(), classification_loss(model), start,
                   torch.tensor([0, 1, 2]), tests, split.train_x, split.train_y, 3, 2,
                   torch.Generator().manual_seed(0), 1)
    for k in start:
        assert torch.equal(got[k][1], start[k][1])
        assert not torch.equal(got[k][0], start[k][0])


@pytest.mark.parametrize("name", ["fedavg_ft", "per_fedavg_fo"])
def test_one_evaluation_step_is_taken(name):
    # Per-FedAvg's evaluation is one SGD step; FedAvg-FT's here too. Zero parameters
    # predict class 0 (accuracy 0 on class-2 samples); one step predicts class 2 for every
    # positive x: logit_2 - logit_0 = lr (xbar . x + 1) > 0
    data = _data([4, 4, 4], labels=torch.full((12,), 2))
    split, tests = client_split(data, 0.5, seed=0)
    model = build_model("logreg", (DIM,), CLASSES)
    loss_fn = classification_loss(model)
    gather = ClientStore(3, {}).gather
    for steps, want in ((1, 1.0), (0, 0.0)):
        algorithm = build_algorithm(name, local_lr=0.1, finetune_steps=steps)
        got = evaluate_personal(model, algorithm, loss_fn, _zeros(model), gather, tests,
                                split.train_x, split.train_y, **_kw())
        assert got["personal_accuracy_mean"] == want
        assert got["personal_accuracy_worst"] == want
        assert got["global_accuracy_mean"] == 0.0


def test_evaluation_finetuning_follows_the_schedule_of_the_round():
    # lr 0.1 in rounds 1-2, 0 from round 3: fine-tuning at round 3 leaves the global model
    data = _data([4, 4], labels=torch.full((8,), 2))
    split, tests = client_split(data, 0.5, seed=0)
    model = build_model("logreg", (DIM,), CLASSES)
    tuned = build_algorithm("fedavg_ft", finetune_steps=1, local_lr={
        "kind": "step", "init": 0.1, "factor": 0.0, "milestones": [3]})
    for round_, want in ((2, 1.0), (3, 0.0)):
        got = evaluate_personal(model, tuned, classification_loss(model), _zeros(model),
                                ClientStore(2, {}).gather, tests, split.train_x,
                                split.train_y, **_kw(round_=round_))
        assert got["personal_accuracy_mean"] == want


# --- seen clients against held-out clients, chunks -------------------------------------

def test_seen_clients_use_their_state_held_out_ones_the_global_model_in_any_chunks():
    # FedPer on logistic regression: the head is the whole model. Client i's stored bias
    # predicts class c_i everywhere, the zero global model class 0; the two held-out clients
    # (4, 5) have a stored bias too, which they must not use
    c = [1, 2, 1, 0, 1, 2]
    data = _data([8] * 6, seed=1)
    split, tests = client_split(data, 0.5, seed=0, held_out=2)
    model = build_model("logreg", (DIM,), CLASSES)
    params = _zeros(model)
    fedper = build_algorithm("fedper")
    store = ClientStore(6, fedper.client_init(params))
    store.state["personal"]["linear.bias"][torch.arange(6), torch.tensor(c)] = 10.0
    labels = [tests.y[tests.indices[i]] for i in range(6)]
    mine = torch.tensor([float((y == ci).double().mean()) for y, ci in zip(labels, c,
                                                                          strict=True)])
    zero = torch.tensor([float((y == 0).double().mean()) for y in labels])
    sizes = torch.full((6,), 4.0)
    assert not torch.equal(mine[4:], zero[4:]) and len(set(mine[:4].tolist())) > 1
    want = {**summarise("personal_accuracy", mine[:4], sizes[:4]),
            **summarise("global_accuracy", zero[:4], sizes[:4]),
            **summarise("held_out_personal_accuracy", zero[4:], sizes[4:]),
            **summarise("held_out_global_accuracy", zero[4:], sizes[4:])}
    for chunk in (1, 3, 64):
        got = evaluate_personal(model, fedper, classification_loss(model), params,
                                store.gather, tests, split.train_x, split.train_y,
                                **_kw(), chunk=chunk)
        columns = got.pop(PER_CLIENT)  # each client's own numbers, the summaries' rows
        assert got == pytest.approx(want, abs=1e-12)
        assert columns["client"].tolist() == list(range(6))
        assert columns["held_out"].tolist() == [False] * 4 + [True] * 2
        assert columns["samples"].tolist() == [4] * 6
        np.testing.assert_allclose(columns["personal_accuracy"],
                                   torch.cat([mine[:4], zero[4:]]).numpy())
        np.testing.assert_allclose(columns["global_accuracy"], zero.numpy())


def test_a_plain_algorithm_is_scored_with_the_global_model():
    data = _data([8] * 3, seed=2)
    split, tests = client_split(data, 0.5, seed=0)
    model = build_model("logreg", (DIM,), CLASSES)
    got = evaluate_personal(model, build_algorithm("fedavg"), classification_loss(model),
                            _zeros(model), ClientStore(3, {}).gather, tests, split.train_x,
                            split.train_y, **_kw())
    got.pop(PER_CLIENT)
    zero = torch.tensor([float((tests.y[t] == 0).double().mean()) for t in tests.indices])
    want = summarise("personal_accuracy", zero, torch.full((3,), 4.0))
    assert got == pytest.approx({**want, **{k.replace("personal", "global"): v
                                            for k, v in want.items()}}, abs=1e-12)


# --- random layers ---------------------------------------------------------------------

class _Dropped(nn.Module):
    def __init__(self, noisy: bool = False) -> None:
        super().__init__()
        self.drop, self.linear, self.noisy = nn.Dropout(0.5), nn.Linear(DIM, CLASSES), noisy

    def forward(self, x):
        if self.noisy:
            x = x + torch.rand_like(x)
        return self.linear(self.drop(x))


def test_finetuning_keys_dropout_and_refuses_other_random_calls():
    data = _data([4, 4], labels=torch.full((8,), 2))
    split, tests = client_split(data, 0.5, seed=0)
    tuned = build_algorithm("fedavg_ft", local_lr=0.5, finetune_steps=2).personal.finetuner()
    model = _Dropped()
    start = stack({k: v.detach() for k, v in model.named_parameters()}, 2)

    def run(m):
        return finetune(tuned, classification_loss(m), start, torch.tensor([0, 1]), tests,
                        split.train_x, split.train_y, 2, 2, torch.Generator().manual_seed(0),
                        1)

    once, again = run(model), run(model)
    for k in start:
        assert torch.equal(once[k], again[k]) and not torch.equal(once[k], start[k])
    with pytest.raises(RandomLayerError, match=r"^engine vmap: the model calls rand_like"):
        run(_Dropped(noisy=True))
