"""Functional LoRA over a frozen base (fedforge.models.lora): PEFT parity, a cohort of
clients' adapters in one computation, and export to PEFT's format.

Tiny random BERT and Llama configurations are built and saved in the test; nothing is
downloaded.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers", reason="needs the extra fedforge[pretrained]")
peft = pytest.importorskip("peft", reason="needs the extra fedforge[pretrained]")

from fedforge.errors import ConfigError  # noqa: E402
from fedforge.models.lora import (  # noqa: E402
    adapter_params,
    add_lora,
    cohort_logits,
    cohort_losses,
    export_peft,
    stack_adapters,
)
from fedforge.models.pretrained import PretrainedModel, load_hf_model  # noqa: E402
from tests.models.test_pretrained import VOCAB, T, tiny_bert, tiny_llama, tokens  # noqa: E402

CLASSES = 3


def lora_config(**kw) -> peft.LoraConfig:
    return peft.LoraConfig(**{"r": 4, "lora_alpha": 8, "lora_dropout": 0.0,
                              "target_modules": ["query", "value", "q_proj", "v_proj"], **kw})


def base_folder(tmp_path: Path, arch: str) -> tuple[Path, str]:
    """(folder, task) of a tiny saved model."""
    if arch == "bert":
        return tiny_bert(tmp_path / "bert", CLASSES), "classification"
    if arch == "llama_cls":
        return tiny_llama(tmp_path / "llama", causal=False, num_labels=CLASSES), "classification"
    return tiny_llama(tmp_path / "llama"), "causal_lm"


def lora_model(folder: Path, task: str, config=None, seed: int = 0) -> PretrainedModel:
    """A LoRA model whose B factors are nonzero (at PEFT's init, B = 0, LoRA is a no-op)."""
    model = PretrainedModel((T,), CLASSES if task == "classification" else VOCAB,
                            path=str(folder), task=task).eval()
    add_lora(model, config or lora_config())
    randomize(model, seed)
    return model


def randomize(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.requires_grad:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))


def random_adapters(model: torch.nn.Module, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {k: 0.2 * torch.randn(v.shape, generator=g) for k, v in adapter_params(model).items()}


@pytest.mark.parametrize("arch", ["bert", "llama_cls", "llama_lm"])
def test_functional_lora_equals_peft_lora_model(tmp_path, arch):
    folder, task = base_folder(tmp_path, arch)
    model = lora_model(folder, task)
    ours = adapter_params(model)
    pm = peft.get_peft_model(load_hf_model(folder, task, CLASSES), lora_config(
        task_type="SEQ_CLS" if task == "classification" else "CAUSAL_LM")).eval()
    with torch.no_grad():  # the same A, B (and head) written into PEFT's own modules
        for name, p in pm.named_parameters():
            if p.requires_grad:
                key = ("hf." + name.removeprefix("base_model.model.")
                       .replace(".modules_to_save.default", "").replace(".default.weight", ""))
                p.copy_(ours.pop(key))
    assert not ours, f"leaves PEFT does not have: {sorted(ours)}"
    x = tokens(3, [T, 5, 9])
    ref = pm(input_ids=x, attention_mask=(x != 0).long()).logits
    got = model(x, all_positions=True)
    keep = (x != 0)[..., None] if task == "causal_lm" else torch.tensor(True)  # LM: pad rows
    torch.testing.assert_close(torch.where(keep, got, 0), torch.where(keep, ref, 0),
                               rtol=0, atol=1e-5)
    base = load_hf_model(folder, task, CLASSES).eval()
    assert (got - base(input_ids=x, attention_mask=(x != 0).long()).logits).abs().max() > 1e-3


@pytest.mark.parametrize("arch", ["bert", "llama_cls"])
def test_the_cohort_computation_equals_the_per_client_loop(tmp_path, arch):
    """Different adapters and heads per client, different padding, an all-padding row of
    weight 0: losses and gradients equal the loop's, each client on its own trimmed batch."""
    model = lora_model(*base_folder(tmp_path, arch))
    clients = [random_adapters(model, seed) for seed in range(3)]
    lengths = [[T, 4, 7], [3, 3, 2], [T, T, 0]]
    x = torch.stack([tokens(3, ln, seed=10 + i) for i, ln in enumerate(lengths)])  # [3, 3, T]
    y = torch.randint(0, CLASSES, (3, 3), generator=torch.Generator().manual_seed(1))
    w = torch.tensor([[1.0, 1, 1], [1, 1, 0], [1, 1, 0]])

    def cohort(stacked):
        losses = cohort_losses(model, stacked, x, y, w)
        return losses.sum(), losses

    grads, losses = torch.func.grad(cohort, has_aux=True)(stack_adapters(clients))
    assert torch.isfinite(losses).all()
    for k, adapters in enumerate(clients):
        width = max(max(lengths[k]), 1)  # the client's batch without the cohort's padding

        def own(a, k=k, width=width):  # one client through the plain (2-D) LoRA path
            logits = torch.func.functional_call(model, a, (x[k, :, :width],))
            ce = torch.nn.functional.cross_entropy(logits, y[k], reduction="none")
            return (ce * w[k]).sum() / w[k].sum()

        g, loss = torch.func.grad_and_value(own)(adapters)
        torch.testing.assert_close(losses[k], loss, rtol=0, atol=1e-6)
        for name in adapters:
            torch.testing.assert_close(grads[name][k], g[name], rtol=0, atol=1e-6)


def test_vmap_over_the_clients_adapters_equals_the_cohort(tmp_path):
    """The other way to batch a cohort: per-client adapters vmapped over the shared base."""
    model = lora_model(*base_folder(tmp_path, "bert"))
    stacked = stack_adapters([random_adapters(model, s) for s in range(3)])
    x = torch.stack([tokens(2, [T, 3 + i], seed=i) for i in range(3)])
    vmapped = torch.func.vmap(lambda a, xk: torch.func.functional_call(model, a, (xk,)))(
        stacked, x)
    torch.testing.assert_close(vmapped, cohort_logits(model, stacked, x), rtol=0, atol=1e-6)


def test_no_clients_loss_sees_another_clients_tokens(tmp_path):
    model = lora_model(*base_folder(tmp_path, "bert"))
    stacked = stack_adapters([random_adapters(model, s) for s in range(2)])
    x = torch.stack([tokens(2, [T, 6], seed=1), tokens(2, [5, T], seed=2)])
    other = x.clone()
    other[1] = tokens(2, [T, 2], seed=9)  # client 1's tokens change
    before, after = (cohort_logits(model, stacked, t) for t in (x, other))
    torch.testing.assert_close(after[0], before[0], rtol=0, atol=1e-6)
    assert (after[1] - before[1]).abs().max() > 1e-3


def test_gradients_flow_only_to_adapter_leaves(tmp_path):
    model = lora_model(*base_folder(tmp_path, "bert"), config=lora_config(
        target_modules=["query", "value"]))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.endswith(("lora_A", "lora_B")) or n.startswith("hf.classifier.")
                             for n in trainable)
    assert sum("lora_A" in n for n in trainable) == 4  # 2 layers x (query, value)
    x = tokens(4, [T, 3, 8, 5])
    torch.nn.functional.cross_entropy(model(x), torch.tensor([0, 1, 2, 0])).backward()
    for name, p in model.named_parameters():
        if name in trainable:
            assert p.grad is not None and p.grad.abs().sum() > 0, name
        else:
            assert p.grad is None, name


def test_unsupported_or_empty_lora_settings_are_refused(tmp_path):
    folder, task = base_folder(tmp_path, "bert")
    model = PretrainedModel((T,), CLASSES, path=str(folder))
    with pytest.raises(ConfigError, match="use_dora"):
        add_lora(model, lora_config(use_dora=True))
    with pytest.raises(ConfigError, match="matches no linear"):
        add_lora(model, lora_config(target_modules=["nothing_here"]))


@pytest.mark.parametrize("arch", ["bert", "llama_lm"])
def test_peft_export_round_trips_with_the_same_logits(tmp_path, arch):
    folder, task = base_folder(tmp_path, arch)
    model = lora_model(folder, task)
    out = export_peft(tmp_path / "adapter", folder, lora_config(), adapter_params(model),
                      task=task, num_labels=CLASSES)
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in out.iterdir()}
    base = load_hf_model(folder, task, CLASSES)  # a classifier's new head is drawn afresh
    loaded = peft.PeftModel.from_pretrained(base, out).eval()
    x = tokens(3, [T, T, T]) if task == "causal_lm" else tokens(3, [T, 4, 7])
    ref = loaded(input_ids=x, attention_mask=(x != 0).long()).logits
    torch.testing.assert_close(model(x, all_positions=True), ref, rtol=0, atol=1e-5)


def test_a_classification_export_without_its_head_is_refused(tmp_path):
    folder, task = base_folder(tmp_path, "bert")
    model = lora_model(folder, task)
    lora_only = {k: v for k, v in adapter_params(model).items() if "lora_" in k}
    with pytest.raises(ConfigError, match="needs its head"):
        export_peft(tmp_path / "adapter", folder, lora_config(), lora_only, task=task,
                    num_labels=CLASSES)
