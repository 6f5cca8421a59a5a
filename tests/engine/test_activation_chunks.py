"""The vmapped engine's automatic chunk from measured activations (engine/activations.py).

A text model's input is a few bytes of token ids per position while its activations are
hundreds of times more; the chunk is sized from the bytes autograd saves for one client's
step, measured once and checkpointed.
"""

from __future__ import annotations

import gc
import json
import weakref

import pytest
import torch
from torch import nn

import fedforge.engine.vmap as vmap_module
from fedforge.core.tree import tree_nbytes
from fedforge.engine import VmapEngine, classification_loss
from fedforge.engine.activations import saved_activation_bytes
from fedforge.engine.base import CohortInputs

B = 5  # batch of the hand-computed case


class SumLoss:
    """``sum(model(x))`` through ``functional_call``: no loss term saves anything itself."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def __call__(self, params, x, y, w):
        return torch.func.functional_call(self.model, params, (x,)).sum()


def stack() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 6), nn.ReLU(),
                         nn.Linear(6, 3))


def batch():
    return torch.randn(B, 4), torch.zeros(B, dtype=torch.long), torch.ones(B)


def test_saved_bytes_are_the_relu_outputs_once_each():
    # every layer trainable: ReLU saves its output a1 [B, 8] and a2 [B, 6]; the next linear
    # saves the same a1 / a2 (one storage each) and its weight (a parameter, not counted);
    # the first linear's input is the batch (not counted): 4 bytes * B * (8 + 6)
    model = stack()
    params = {k: v.detach() for k, v in model.named_parameters()}
    assert saved_activation_bytes(SumLoss(model), params, *batch()) == 4 * B * (8 + 6)


def test_frozen_weights_are_not_activations():
    # only the first layer trains (LoRA-like: the rest of the model is frozen in the module):
    # the later linears save their frozen weights (shared by every client under vmap, not
    # counted) and the ReLUs their outputs: the same 4 * B * (8 + 6); counting the frozen
    # weights would add 4 * (8 * 6 + 6 * 3)
    model = stack().requires_grad_(False)
    params = {k: v.detach() for k, v in model.named_parameters() if k.startswith("0.")}
    assert saved_activation_bytes(SumLoss(model), params, *batch()) == 4 * B * (8 + 6)
    # only the head trains: its input a2 [B, 6] is all autograd keeps
    head = {k: v.detach() for k, v in model.named_parameters() if k.startswith("4.")}
    assert saved_activation_bytes(SumLoss(model), head, *batch()) == 4 * B * 6


class RecordingLoss(SumLoss):
    """``SumLoss`` that keeps a weak reference to each output it computes."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self.outputs: list[weakref.ref] = []

    def __call__(self, params, x, y, w):
        out = torch.func.functional_call(self.model, params, (x,))
        self.outputs.append(weakref.ref(out))
        return out.sum()


def test_a_measurement_frees_its_graph():
    # the hooks are held by the graph's nodes; a tensor they kept kept its own node alive
    # (a cycle gc cannot see), so every measurement leaked one step's activations (220 MiB
    # each for MiniLM, twice before a LoRA run's first round)
    model = stack()[:4]  # ends in a ReLU, which saves its output: the tensor returned
    params = {k: v.detach() for k, v in model.named_parameters()}
    loss = RecordingLoss(model)
    for _ in range(2):
        assert saved_activation_bytes(loss, params, *batch()) == 4 * B * (8 + 6)
    gc.collect()
    assert [ref() for ref in loss.outputs] == [None, None]


def test_measuring_with_dropout_draws_no_random_numbers():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 3))
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, y, w = batch()
    before = torch.get_rng_state()
    assert saved_activation_bytes(classification_loss(model), params, x, y, w) > 0
    assert torch.equal(torch.get_rng_state(), before)


# --- a tiny transformer with LoRA adapters: what sizes the chunk ------------------------------

COHORT, STEPS, BATCH, SEQ, VOCAB = 12, 1, 16, 32, 50


def lora_transformer():
    peft = pytest.importorskip("peft", reason="needs the extra fedforge[pretrained]")
    from fedforge.models import build_model
    from fedforge.models.lora import adapter_params, add_lora

    torch.manual_seed(0)
    model = build_model("transformer_tiny", (SEQ,), 2, vocab_size=VOCAB)
    add_lora(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["qkv"],
                                    modules_to_save=["head"]))
    return model, adapter_params(model)


def cohort(params):
    g = torch.Generator().manual_seed(1)
    n = COHORT * STEPS * BATCH
    x = torch.randint(1, VOCAB, (n, SEQ), generator=g)
    y = torch.randint(0, 2, (n,), generator=g)
    idx = torch.arange(n).view(COHORT, STEPS, BATCH)
    inputs = CohortInputs(params, {}, {}, {}, idx, torch.ones(COHORT, STEPS, BATCH),
                          torch.full((COHORT,), 1.0 / COHORT))
    return x, y, inputs


def per_client(engine: VmapEngine, params, x, activations: float) -> int:
    """The docstring's estimate: state_factor model copies, the batches, the activations."""
    sample = x[:1].numel() * x.element_size()
    return int(engine.state_factor * tree_nbytes(params) + STEPS * BATCH * sample + activations)


def measured_client(engine: VmapEngine, params, x, measured: int) -> int:
    """The estimate with measured activations: ``activation_factor`` times the saved bytes."""
    return per_client(engine, params, x, engine.activation_factor * measured)


def test_lora_chunk_is_the_budget_over_the_measured_client(monkeypatch):
    model, params = lora_transformer()
    loss_fn = classification_loss(model)
    x, y, inputs = cohort(params)
    measured = saved_activation_bytes(loss_fn, params, x[:BATCH], y[:BATCH], torch.ones(BATCH))
    old_allowance = 64 * BATCH * x[:1].numel() * x.element_size()
    assert measured > 4 * old_allowance  # the token ids say little about the activations
    engine = VmapEngine()
    budget = 4.5 * measured_client(engine, params, x, measured)
    monkeypatch.setattr(vmap_module, "_free_memory_bytes", lambda device: 2 * budget)
    assert engine.chunk_size(inputs, x, y, loss_fn) == 4  # floor(4.5)
    assert list(engine.activations.bytes.values()) == [measured]
    old = int(budget // per_client(engine, params, x, old_allowance))
    assert old > 4  # the input-sized allowance would have run wider chunks
    # without the loss the rough allowance remains (callers that cannot measure)
    assert VmapEngine().chunk_size(inputs, x) == min(old, COHORT)


def test_run_cohort_runs_the_measured_chunks(monkeypatch):
    from fedforge.algorithms import build_algorithm

    model, params = lora_transformer()
    loss_fn = classification_loss(model)
    x, y, inputs = cohort(params)
    measured = saved_activation_bytes(loss_fn, params, x[:BATCH], y[:BATCH], torch.ones(BATCH))
    calls = []

    class Counting(VmapEngine):
        def wrap(self, fn):
            chunk_fn = super().wrap(fn)
            return lambda *args: calls.append(args[4].shape[0]) or chunk_fn(*args)

    engine = Counting()
    budget = 5.2 * measured_client(engine, params, x, measured)
    monkeypatch.setattr(vmap_module, "_free_memory_bytes", lambda device: 2 * budget)
    engine.run_cohort(build_algorithm("fedavg"), loss_fn, x, y, inputs)  # no client state
    assert calls == [5, 5, 2]


def test_chunk_is_at_least_one_and_at_most_the_cohort(monkeypatch):
    model, params = lora_transformer()
    loss_fn = classification_loss(model)
    x, y, inputs = cohort(params)
    monkeypatch.setattr(vmap_module, "_free_memory_bytes", lambda device: 1)
    assert VmapEngine().chunk_size(inputs, x, y, loss_fn) == 1
    monkeypatch.setattr(vmap_module, "_free_memory_bytes", lambda device: 2**50)
    assert VmapEngine().chunk_size(inputs, x, y, loss_fn) == COHORT


def test_a_resumed_engine_reuses_the_measurement(monkeypatch):
    model, params = lora_transformer()
    loss_fn = classification_loss(model)
    x, y, inputs = cohort(params)
    first = VmapEngine()
    measured = saved_activation_bytes(loss_fn, params, x[:BATCH], y[:BATCH], torch.ones(BATCH))
    budget = 4.5 * measured_client(first, params, x, measured)
    monkeypatch.setattr(vmap_module, "_free_memory_bytes", lambda device: 2 * budget)
    chunk = first.chunk_size(inputs, x, y, loss_fn)
    assert chunk == 4
    state = json.loads(json.dumps(first.state_dict()))  # as checkpoint meta stores it
    assert list(state) == ["activation_bytes"]
    [(key, recorded)] = state["activation_bytes"].items()
    assert recorded == measured
    assert key.endswith(f"x({BATCH}, {SEQ}):torch.int64 y({BATCH},):torch.int64 fp32 cpu")

    def no_measuring(*args):
        raise AssertionError("measured again")

    monkeypatch.setattr("fedforge.engine.activations.saved_activation_bytes", no_measuring)
    resumed = VmapEngine()
    resumed.load_state_dict(state)
    assert resumed.chunk_size(inputs, x, y, loss_fn) == chunk
    # a recorded measurement is what sizes the chunk: a smaller one gives wider chunks
    smaller = VmapEngine()
    smaller.load_state_dict({"activation_bytes": {key: measured // 4}})
    assert smaller.chunk_size(inputs, x, y, loss_fn) > 4
    with pytest.raises(ValueError, match="engine.activation_bytes"):
        VmapEngine().load_state_dict({"activation_bytes": {key: "many"}})
