"""Frozen weights cast to bf16 once per local round (fedforge.engine.frozen_casts): the same
bits as bf16 autocast's cast at every step, in the loop and the vmapped engine; the casts
really happen once a round; float32-autocast layers (LayerNorm, embeddings) stay float32."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

pytest.importorskip("transformers", reason="needs the extra fedforge[pretrained]")
pytest.importorskip("peft", reason="needs the extra fedforge[pretrained]")

import fedforge.engine.stages as stages  # noqa: E402
from fedforge.algorithms import build_algorithm  # noqa: E402
from fedforge.core.store import ClientStore  # noqa: E402
from fedforge.engine import LoopEngine, VmapEngine, classification_loss  # noqa: E402
from fedforge.engine.draw import RoundDraw  # noqa: E402
from fedforge.engine.frozen_casts import frozen_targets  # noqa: E402
from fedforge.engine.round import RoundSetup, federated_round  # noqa: E402
from fedforge.models import build_model  # noqa: E402
from tests.models.test_finetune import (  # noqa: E402
    ADAPTERS,
    CLASSES,
    T,
    _leaves,
    _nonzero_b,
    _round_inputs,
    tiny_bert_with_tokenizer,
)

STEPS = 3


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return tiny_bert_with_tokenizer(tmp_path_factory.mktemp("bert"), dropout=0.1)


def _model(folder, **options):
    torch.manual_seed(0)
    return build_model("pretrained", (T,), CLASSES, path=str(folder),
                       adapters={**ADAPTERS, "lora_dropout": 0.1}, **options)


def _rounds(model, engine, precision: str, rounds: int = 2, clients: int = 2,
            padded: bool = True) -> dict:
    """``rounds`` FedAvg rounds over every client, ``STEPS`` local steps each (``padded``:
    the last client's last step is padding)."""
    algorithm = build_algorithm("fedavg", local_lr=0.5)
    x, y, idx, w = _round_inputs(clients=clients, steps=STEPS, batch=2)
    w = w if padded else torch.ones_like(w)
    params = _nonzero_b(_leaves(model))
    state = algorithm.server_init(params)
    store = ClientStore(clients, algorithm.client_init(params))
    loss_fn = classification_loss(model, precision)
    for t in range(1, rounds + 1):
        draw = RoundDraw(torch.arange(clients), idx, w, round=t).with_keys(0)
        params, state, _ = federated_round(RoundSetup(algorithm, engine, loss_fn, store, x, y),
                                           params, state, draw)
    return params


def _without_precast(monkeypatch):
    monkeypatch.setattr(stages, "loss_targets", lambda loss_fn: [])


@pytest.mark.parametrize("engine", [LoopEngine, lambda: VmapEngine(chunk_size=2)],
                         ids=["loop", "vmap"])
def test_the_precast_round_is_bit_for_bit_autocast_s(bert, engine, monkeypatch):
    model = _model(bert)
    assert frozen_targets(model)  # the base's linears are cast once a round
    got = _rounds(model, engine(), "bf16")
    with monkeypatch.context() as m:
        _without_precast(m)
        want = _rounds(model, engine(), "bf16")
    for k in want:
        assert got[k].dtype == torch.float32  # fp32 master weights
        assert torch.equal(got[k], want[k]), k
    fp32 = _rounds(model, engine(), "fp32")
    assert any(not torch.equal(got[k], fp32[k]) for k in fp32)  # really computed in bf16


class _Casts(TorchDispatchMode):
    """Counts float32 -> bf16 copies of the given tensors."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        super().__init__()
        self.ptrs, self.count = {t.data_ptr() for t in tensors}, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (func is torch.ops.aten._to_copy.default and kwargs.get("dtype") == torch.bfloat16
                and args[0].data_ptr() in self.ptrs):
            self.count += 1
        return func(*args, **kwargs)


def _frozen_casts(model) -> tuple[int, int]:
    """(frozen tensors, their bf16 casts in one round of one client)."""
    frozen = list({id(p): p for p in (t.module._parameters[t.name]
                                      for t in frozen_targets(model))}.values())
    with _Casts(frozen) as casts:
        _rounds(model, LoopEngine(), "bf16", rounds=1, clients=1, padded=False)
    return len(frozen), casts.count


def test_frozen_weights_are_cast_once_a_round_not_at_every_step(bert, monkeypatch):
    model = _model(bert)
    n, once = _frozen_casts(model)
    assert n > 0 and once == n
    _without_precast(monkeypatch)
    assert _frozen_casts(model) == (n, STEPS * n)  # autocast alone: again at every step


def test_float32_layers_stay_float32_and_the_weights_come_back(bert):
    model = _model(bert)
    seen: dict[str, set] = {"LayerNorm": set(), "Embedding": set(), "Linear": set()}

    def record(module, args):
        seen[type(module).__name__].add(module.weight.dtype)

    hooks = [m.register_forward_pre_hook(record) for m in model.base.modules()
             if type(m).__name__ in seen]
    try:
        _rounds(model, LoopEngine(), "bf16", rounds=1)
    finally:
        for h in hooks:
            h.remove()
    assert seen == {"LayerNorm": {torch.float32}, "Embedding": {torch.float32},
                    "Linear": {torch.bfloat16}}
    assert all(p.dtype == torch.float32 for p in model.base.parameters())


def test_frozen_bf16_base_and_fp32_runs_have_no_targets(bert):
    model = _model(bert, precision="bf16")  # the base held in bf16: nothing to cast
    assert frozen_targets(model) == []
    assert stages.loss_targets(classification_loss(_model(bert), "fp32")) == []


class _Sub(nn.Linear):
    """A subclass may read its weight otherwise."""


def test_only_frozen_operands_of_bf16_ops_are_targets():
    emb, tied, lin, sub, norm = (nn.Embedding(5, 4), nn.Linear(4, 5), nn.Linear(4, 4),
                                 _Sub(4, 4), nn.LayerNorm(4))
    tied.weight = emb.weight  # an output layer tied to its embedding
    trained = nn.Linear(4, 4)
    model = nn.ModuleList([emb, tied, lin, sub, norm, trained])
    for m in model[:5]:
        m.requires_grad_(False)
    got = {(id(t.module), t.name) for t in frozen_targets(model)}
    assert got == {(id(lin), "weight"), (id(lin), "bias"), (id(tied), "bias")}
