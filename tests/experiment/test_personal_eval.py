"""The personalised evaluation protocol: per-client splits, batched per-client accuracy,
the summary statistics, fine-tuning at evaluation, and a run's records."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from fedforge.algorithms import build_algorithm
from fedforge.core.store import ClientStore
from fedforge.data.batching import client_batches
from fedforge.data.client_split import client_split
from fedforge.data.federated import FederatedDataset
from fedforge.engine import classification_loss
from fedforge.engine.client_eval import client_accuracy
from fedforge.experiment.personal_eval import (
    evaluate_personal,
    finetune,
    personal_models,
    stack,
    summarise,
)
from fedforge.models import build_model

ROOT = Path(__file__).resolve().parents[2]


def _data(sizes=(8, 4, 13, 6), dim=3, classes=3, seed=0) -> FederatedDataset:
    gen = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    x = torch.randn(n, dim, generator=gen)
    y = torch.randint(0, classes, (n,), generator=gen)
    starts = np.cumsum([0, *sizes])
    parts = [torch.arange(a, b) for a, b in zip(starts[:-1], starts[1:], strict=True)]
    return FederatedDataset(x, y, x[:5], y[:5], parts, None, classes, (dim,), "toy")


def test_summary_statistics_by_hand():
    acc = torch.tensor([1.0, 0.5, 0.25, 0.0, 0.75])
    n = torch.tensor([2.0, 4.0, 4.0, 0.0, 4.0])  # the client without test data is left out
    got = summarise("personal_accuracy", acc, n)
    assert got["personal_accuracy_mean"] == pytest.approx((1 + 0.5 + 0.25 + 0.75) / 4)
    assert got["personal_accuracy_weighted"] == pytest.approx((2 + 2 + 1 + 3) / 14)
    # numpy's linear percentile of [0.25, 0.5, 0.75, 1.0] at 10 %: 0.25 + 0.3 * 0.25
    assert got["personal_accuracy_p10"] == pytest.approx(0.325)
    assert got["personal_accuracy_worst"] == 0.25


def test_hold_out_is_per_client_seeded_and_disjoint():
    data = _data()
    split, tests = client_split(data, 0.25, seed=3)
    again, tests2 = client_split(data, 0.25, seed=3)
    other = client_split(data, 0.25, seed=4)[1]
    for i, part in enumerate(data.client_indices):
        train, test = set(split.client_indices[i].tolist()), set(tests.indices[i].tolist())
        assert not train & test and train | test == set(part.tolist())
        assert len(test) == math.floor(0.25 * len(part))
        assert torch.equal(tests.indices[i], tests2.indices[i])
    assert any(not torch.equal(a, b) for a, b in zip(tests.indices, other.indices, strict=True))
    assert torch.equal(tests.x, data.train_x)  # held-out samples come from the training set


def test_held_out_clients_keep_their_samples_for_finetuning():
    data = _data()
    split, tests = client_split(data, 0.25, seed=0, held_out=2)
    assert tests.held_out.tolist() == [2, 3]
    # not drawn to train (the sampler's job), so their training samples stay theirs
    assert [len(p) for p in split.client_indices] == [8 - 2, 4 - 1, 13 - 3, 6 - 1]
    assert tests.train_sizes.tolist() == [8 - 2, 4 - 1, 13 - 3, 6 - 1]
    with pytest.raises(ValueError, match=r"^eval.held_out: expected 0 <= n < 4 .*got 4$"):
        client_split(data, 0.25, seed=0, held_out=4)


def test_natural_test_split_is_used_where_the_dataset_has_one():
    data = _data()
    own = [torch.tensor([0, 1]), torch.tensor([2]), torch.tensor([3, 4]),
           torch.tensor([], dtype=torch.int64)]
    data.client_test_indices = own
    split, tests = client_split(data, 0.25, seed=0, natural=True)
    assert tests.x is data.test_x and [t.tolist() for t in tests.indices] == [
        t.tolist() for t in own]
    assert [len(p) for p in split.client_indices] == [8, 4, 13, 6]


def test_batched_accuracy_equals_a_loop_over_clients():
    data = _data()
    model = build_model("mlp", (3,), 3, hidden=(5,))
    base = {k: v.detach() for k, v in model.named_parameters()}
    params = {k: torch.stack([v + 0.3 * i for i in range(4)]) for k, v in base.items()}
    acc, n = client_accuracy(model, params, data.train_x, data.train_y, data.client_indices,
                             batch_size=10)  # several chunks of clients
    for i, idx in enumerate(data.client_indices):
        p = {k: v[i] for k, v in params.items()}
        logits = torch.func.functional_call(model, p, (data.train_x[idx],))
        want = (logits.argmax(-1) == data.train_y[idx]).double().mean()
        assert acc[i] == pytest.approx(float(want))
        assert n[i] == len(idx)


def test_personal_models_read_the_clients_own_leaves():
    model = build_model("mlp", (3,), 3, hidden=(5,))
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    fedper = build_algorithm("fedper")  # head = the last layer, net.2.*
    store = ClientStore(3, fedper.client_init(params))
    store.state["personal"]["net.2.bias"][1] += 1.0
    got = personal_models(fedper, params, store.gather(torch.tensor([0, 1])), 2)
    assert torch.equal(got["net.2.bias"][1], params["net.2.bias"] + 1.0)
    assert torch.equal(got["net.2.bias"][0], params["net.2.bias"])
    assert torch.equal(got["net.0.weight"][1], params["net.0.weight"])  # the shared body


def test_finetuning_at_evaluation():
    data = _data(sizes=(8, 4, 13, 60))
    split, tests = client_split(data, 0.25, seed=0, held_out=1)
    model = build_model("logreg", (3,), 3)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    loss_fn = classification_loss(model)
    tuned = build_algorithm("fedavg_ft", local_lr=0.5, finetune_steps=5)
    ids = torch.tensor([0, 3])
    start = stack(params, 2)
    got = finetune(tuned.personal.finetuner(), loss_fn, start, ids, tests, split.train_x,
                   split.train_y, 5, 2, torch.Generator().manual_seed(0), 1)
    # one client by hand: the same batches, plain SGD on the masked mean cross-entropy
    gen = torch.Generator().manual_seed(0)
    pos, w = client_batches(tests.train_sizes[ids], 5, None, 2, gen)
    idx = tests.train_table[ids[1], pos[1]]
    p = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    for k in range(5):
        loss = loss_fn(p, split.train_x[idx[k]], split.train_y[idx[k]], w[1, k].float())
        g = torch.autograd.grad(loss, list(p.values()))
        p = {n: (v - 0.5 * gi).detach().requires_grad_(True) for (n, v), gi in
             zip(p.items(), g, strict=True)}
    for n in params:
        torch.testing.assert_close(got[n][1], p[n].detach())
        assert not torch.equal(got[n][0], params[n])
    empty = ClientStore(4, {})
    kw = dict(batch_size=64, train_batch_size=2, seed=0, round_=1)
    a = evaluate_personal(model, tuned, loss_fn, params, empty.gather, tests, split.train_x,
                          split.train_y, held_out_steps=5, **kw)
    assert {"personal_accuracy_p10", "global_accuracy_worst",
            "held_out_personal_accuracy_mean"} <= set(a)
    assert a == evaluate_personal(model, tuned, loss_fn, params, empty.gather, tests,
                                  split.train_x, split.train_y, held_out_steps=5, **kw)
