"""A pretrained model computes on the real tokens only (fedforge.models.real_rows): its layer
stack runs packed and its other linear layers skip the padding rows, with the same logits,
gradients and dropout masks as the padded batch; nothing changes under vmap or for a cohort's
stacked adapters.

Tiny random BERT and Llama configurations are built in the test; nothing is downloaded.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="needs the extra fedforge[pretrained]")
pytest.importorskip("peft", reason="needs the extra fedforge[pretrained]")

from fedforge.engine.randomness import KeyedRandomness  # noqa: E402
from fedforge.models import real_rows  # noqa: E402
from fedforge.models.lora import (  # noqa: E402
    adapter_params,
    add_lora,
    cohort_logits,
    stack_adapters,
)
from fedforge.models.pretrained import PretrainedModel  # noqa: E402
from tests.models.test_lora import (  # noqa: E402
    CLASSES,
    base_folder,
    lora_config,
    lora_model,
    random_adapters,
)
from tests.models.test_pretrained import VOCAB, T, tiny_bert, tokens  # noqa: E402

LENGTHS = [T, 3, 7, 1]  # 23 of 48 rows real


def key_rows(model: torch.nn.Module) -> list[int]:
    """The rows each call of the model's first key projection multiplies (a plain linear,
    hooked after the padding hooks, so it sees what the matmul sees)."""
    seen: list[int] = []
    name = next(n for n, m in model.named_modules()
                if n.endswith(("key", "k_proj")) and type(m) is torch.nn.Linear)
    model.get_submodule(name).register_forward_pre_hook(
        lambda _m, args: seen.append(args[0].reshape(-1, args[0].shape[-1]).shape[0]))
    return seen


def norm_rows(model: torch.nn.Module) -> list[int]:
    """The rows each call of the first layer's first norm sees (inside the layer stack)."""
    seen: list[int] = []
    norm = next(m for n, m in model.named_modules() if "layer" in n and (
        isinstance(m, torch.nn.LayerNorm) or type(m).__name__.endswith("RMSNorm")))
    norm.register_forward_pre_hook(
        lambda _m, args: seen.append(args[0].reshape(-1, args[0].shape[-1]).shape[0]))
    return seen


def logits_and_grads(model: PretrainedModel, x: torch.Tensor, causal_lm: bool
                     ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    out = model(x, all_positions=True) if causal_lm else model(x)
    if causal_lm:  # the real positions only: a padding row's logits are never read
        out = out[~real_rows.trailing_padding(x, model.pad_id)]
    grads = torch.autograd.grad(out.square().sum(), list(trainable.values()))
    return out.detach(), dict(zip(trainable, grads, strict=True))


def test_trailing_padding_keeps_a_padding_id_inside_a_sequence():
    x = torch.tensor([[5, 0, 7, 0, 0], [0, 0, 0, 0, 0], [1, 2, 3, 4, 5]])
    expected = torch.tensor([[0, 0, 0, 1, 1], [0, 1, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=torch.bool)
    assert torch.equal(real_rows.trailing_padding(x, 0), expected)


@pytest.mark.parametrize("arch", ["bert", "llama_cls", "llama_lm"])
@pytest.mark.parametrize("mode", ["lora", "full"])
def test_the_real_rows_give_the_padded_batchs_logits_and_gradients(tmp_path, monkeypatch,
                                                                    arch, mode):
    folder, task = base_folder(tmp_path, arch)
    model = (lora_model(folder, task) if mode == "lora" else PretrainedModel(
        (T,), CLASSES if task == "classification" else VOCAB, path=str(folder),
        task=task).eval())
    x = tokens(len(LENGTHS), LENGTHS)
    x[0, 4] = model.pad_id  # a padding id inside a sequence: a real row, scored
    seen, normed = key_rows(model), norm_rows(model)
    got = logits_and_grads(model, x, task == "causal_lm")
    monkeypatch.setattr(real_rows, "MIN_PADDING", 1.01)  # never skip padding
    ref = logits_and_grads(model, x, task == "causal_lm")
    assert seen == normed == [sum(LENGTHS), x.numel()]  # the stack ran packed, then padded
    torch.testing.assert_close(got[0], ref[0], rtol=0, atol=1e-6)
    for name, g in ref[1].items():
        torch.testing.assert_close(got[1][name], g, rtol=0, atol=1e-6, msg=name)


def test_a_batch_with_little_padding_multiplies_every_row(tmp_path):
    model = lora_model(*base_folder(tmp_path, "bert"))
    seen = key_rows(model)
    model(tokens(10, [T] * 9 + [T - 1]))  # 1 of 120 rows padding, under MIN_PADDING
    assert seen == [10 * T]


def test_under_vmap_every_row_is_multiplied(tmp_path):
    model = lora_model(*base_folder(tmp_path, "bert"))
    stacked = stack_adapters([random_adapters(model, s) for s in range(2)])
    x = tokens(len(LENGTHS), LENGTHS)
    seen = key_rows(model)
    vmapped = torch.vmap(lambda a: torch.func.functional_call(model, a, (x,)))(stacked)
    assert seen == [x.numel()]
    for k in range(2):
        own = {n: v[k] for n, v in stacked.items()}
        torch.testing.assert_close(vmapped[k], torch.func.functional_call(model, own, (x,)),
                                   rtol=0, atol=1e-6)
    assert seen[1:] == [sum(LENGTHS)] * 2
    assert set(adapter_params(model)) == set(stacked)


def keyed_logits_and_grads(model: torch.nn.Module, x: torch.Tensor
                           ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    with KeyedRandomness(torch.tensor(12345), step=3, engine="loop"):
        return logits_and_grads(model, x, causal_lm=False)


def test_dropout_on_packed_rows_draws_the_padded_batchs_masks(tmp_path, monkeypatch):
    model = PretrainedModel((T,), CLASSES, path=str(tiny_bert(tmp_path / "b", CLASSES, 0.3)))
    add_lora(model, lora_config(lora_dropout=0.3))
    model.train()
    x = tokens(len(LENGTHS), LENGTHS)
    normed = norm_rows(model)
    got = keyed_logits_and_grads(model, x)
    with monkeypatch.context() as m:
        m.setattr(real_rows, "MIN_PADDING", 1.01)  # padded: every engine's masks
        ref = keyed_logits_and_grads(model, x)
    with monkeypatch.context() as m:  # masks keyed by the packed index: other masks
        m.setattr("fedforge.engine.randomness.padded_elements", lambda _shape: None)
        wrong = keyed_logits_and_grads(model, x)
    assert normed == [sum(LENGTHS), x.numel(), sum(LENGTHS)]
    torch.testing.assert_close(got[0], ref[0], rtol=0, atol=1e-6)
    for name, g in ref[1].items():
        torch.testing.assert_close(got[1][name], g, rtol=0, atol=1e-6, msg=name)
    assert (wrong[0] - ref[0]).abs().max() > 1e-5  # later sequences start elsewhere packed


def test_a_cohorts_stacked_adapters_run_the_stack_padded(tmp_path):
    model = lora_model(*base_folder(tmp_path, "bert"))
    stacked = stack_adapters([random_adapters(model, s) for s in range(2)])
    x = tokens(len(LENGTHS), LENGTHS)
    cohort = torch.stack([x, x])
    normed = norm_rows(model)
    together = cohort_logits(model, stacked, cohort)
    assert normed == [cohort.numel()]  # padded: whole client blocks
    for k in range(2):
        own = {n: v[k] for n, v in stacked.items()}
        torch.testing.assert_close(together[k], torch.func.functional_call(model, own, (x,)),
                                   rtol=0, atol=1e-6)


@pytest.mark.parametrize("arch", ["bert", "llama_cls"])
def test_the_hf_model_called_with_a_2d_mask_still_masks_padding(tmp_path, arch):
    """The packed stack's attention implementation builds a 2-D mask as the model's own did."""
    from fedforge.models.pretrained import load_hf_model

    folder, task = base_folder(tmp_path, arch)
    model = PretrainedModel((T,), CLASSES, path=str(folder), task=task).eval()
    plain = load_hf_model(folder, task, CLASSES).eval()
    x = tokens(len(LENGTHS), LENGTHS)
    mask = (x != model.pad_id).long()
    with torch.no_grad():
        torch.testing.assert_close(model.hf(input_ids=x, attention_mask=mask).logits,
                                   plain(input_ids=x, attention_mask=mask).logits,
                                   rtol=0, atol=1e-6)
