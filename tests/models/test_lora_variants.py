"""The federated LoRA variants as fedforge composes them (docs/finetuning.md):

* FFA-LoRA (Sun et al. 2024): ``model.options.freeze_a = true`` keeps every A at its seeded
  first value, held beside the base: B and the head alone are trained, stored and sent;
* FedSA-LoRA (Guo et al. 2025): ``algorithm.name = "fedper"`` with ``model.head =
  ["*.lora_B"]``: A (and the head) averaged, each client's B its own.

Each is checked against a hand-rolled reference over a tiny random BERT, with a wrong variant
that differs.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="needs the extra fedforge[pretrained]")
pytest.importorskip("peft", reason="needs the extra fedforge[pretrained]")

from fedforge.algorithms import build_algorithm  # noqa: E402
from fedforge.core.tree import flatten_dict  # noqa: E402
from fedforge.engine import LoopEngine, VmapEngine  # noqa: E402
from fedforge.errors import ConfigError  # noqa: E402
from fedforge.models import build_model  # noqa: E402
from tests.models.test_finetune import (  # noqa: E402
    ADAPTERS,
    CLASSES,
    T,
    _leaves,
    _nonzero_b,
    _round_inputs,
    bert,  # noqa: F401 (the module's tiny model folder)
    engine_run,
    reference_fedavg,
)

LR = 0.5


def _model(folder, seed: int = 0, **options):
    torch.manual_seed(seed)
    return build_model("pretrained", (T,), CLASSES, path=str(folder), adapters=ADAPTERS,
                       **options)


def test_freeze_a_holds_a_beside_the_base_at_its_seeded_first_value(bert):  # noqa: F811
    plain, frozen = _model(bert), _model(bert, freeze_a=True)
    names = [n for n, _ in frozen.named_parameters()]
    assert names and not any(n.endswith(".lora_A") for n in names)
    assert sorted(frozen.fixed) == sorted(n for n, _ in plain.named_parameters()
                                          if n.endswith(".lora_A"))
    for name, value in frozen.fixed.items():  # the same draws as the trained variant's
        assert torch.equal(value, plain.get_parameter(name).detach())
    assert torch.equal(frozen.get_parameter("hf.classifier.weight"),
                       plain.get_parameter("hf.classifier.weight"))
    with pytest.raises(ConfigError, match="model.options.freeze_a"):
        build_model("pretrained", (T,), CLASSES, path=str(bert), mode="full", freeze_a=True)


@pytest.mark.parametrize("engine", [LoopEngine(), VmapEngine(chunk_size=3)],
                         ids=["loop", "vmap"])
def test_two_ffa_lora_rounds_equal_fedavg_with_a_fixed(bert, engine):  # noqa: F811
    model = _model(bert, seed=5, freeze_a=True)  # the run's seed draws A, not the base's 0
    start = _nonzero_b(_leaves(model))
    x, y, idx, w = _round_inputs(clients=3, steps=2, batch=3)
    got, _ = engine_run(build_algorithm("fedavg", local_lr=LR), model, engine, start, 2,
                        x, y, idx, w)
    want = reference_fedavg(bert, start, 2, LR, x, y, idx, w, fixed=model.fixed)
    assert set(got) == set(start)  # A is never a leaf: neither sent nor averaged
    assert any((got[k] - start[k]).abs().max() > 1e-3 for k in start)
    for k in start:
        torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-5)
    # the rounds ran through the seeded A: another A (the base's placeholder) differs
    other = {k: model.base.get_parameter(k).detach().float() for k in model.fixed}
    assert any(not torch.equal(other[k], v) for k, v in model.fixed.items())
    wrong = reference_fedavg(bert, start, 2, LR, x, y, idx, w, fixed=other)
    assert max((got[k] - wrong[k]).abs().max() for k in start) > 1e-4


def test_ffa_lora_sends_fewer_bytes_and_exports_a(bert, tmp_path):  # noqa: F811
    plain, frozen = _model(bert), _model(bert, freeze_a=True)
    size = {m: sum(p.numel() for p in m.parameters()) for m in (plain, frozen)}
    assert size[plain] - size[frozen] == sum(v.numel() for v in frozen.fixed.values())
    params = _nonzero_b(_leaves(frozen))
    frozen.export_peft(tmp_path / "adapter", params)
    from safetensors.torch import load_file  # noqa: PLC0415

    saved = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert sum(k.endswith("lora_A.weight") for k in saved) == len(frozen.fixed)


def _fedsa_reference(folder, start: dict, rounds: int, x, y, idx, w):
    """FedSA-LoRA written plainly: each client trains A, B and the head from the global A
    and head and its own B; the server averages all but B (by samples); B stays."""
    own_b = [{k: v for k, v in start.items() if k.endswith(".lora_B")} for _ in idx]
    shared = {k: v for k, v in start.items() if not k.endswith(".lora_B")}
    sizes = w.sum((1, 2))
    for _ in range(rounds):
        trained = [reference_fedavg(folder, {**shared, **own_b[c]}, 1, LR, x, y,
                                    idx[c:c + 1], w[c:c + 1]) for c in range(len(idx))]
        shared = {k: sum(sizes[c] / sizes.sum() * trained[c][k] for c in range(len(idx)))
                  for k in shared}
        own_b = [{k: p[k] for k in own_b[0]} for p in trained]
    return shared, own_b


def test_two_fedsa_lora_rounds_share_a_and_keep_each_clients_b(bert):  # noqa: F811
    model = _model(bert)
    start = _nonzero_b(_leaves(model))
    x, y, idx, w = _round_inputs(clients=3, steps=2, batch=3)
    algorithm = build_algorithm("fedper", local_lr=LR, head=["*.lora_B"])
    got, store = engine_run(algorithm, model, LoopEngine(), start, 2, x, y, idx, w)
    shared, own_b = _fedsa_reference(bert, start, 2, x, y, idx, w)
    for k, v in shared.items():
        torch.testing.assert_close(got[k], v, rtol=1e-4, atol=1e-5)
    state = flatten_dict(store.gather(torch.arange(len(idx))))
    for c, b in enumerate(own_b):
        for k, v in b.items():
            torch.testing.assert_close(state[f"personal/{k}"][c], v, rtol=1e-4, atol=1e-5)
    b_names = list(own_b[0])
    assert not torch.allclose(state[f"personal/{b_names[0]}"][0],
                              state[f"personal/{b_names[0]}"][1])  # each client its own
    # B is never averaged: the global model keeps its first B, where plain FedAvg's moves
    fedavg = reference_fedavg(bert, start, 2, LR, x, y, idx, w)
    for k in b_names:
        assert torch.equal(got[k], start[k])
        assert (fedavg[k] - got[k]).abs().max() > 1e-5
