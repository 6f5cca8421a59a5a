"""A pretrained model whose parameters are only its trainable leaves: ``model.name = "pretrained"``.

The frozen base (a local Hugging Face model, :mod:`.pretrained`) is loaded once per process
and held outside the module tree, whatever the cohort: the module's ``named_parameters`` are
exactly what is trained, so every engine, algorithm, client store, checkpoint and the
``bytes_up``/``bytes_down`` counters see only them, with no change of their own.

* ``mode = "lora"`` (default): the leaves are the LoRA factors ``<module>.lora_A`` [r, in]
  and ``<module>.lora_B`` [out, r] of each target linear (:mod:`.lora`, PEFT's settings), and
  a classification head (``hf.classifier.*`` or ``hf.score.*``). The names end in
  ``lora_A``/``lora_B``, so parameter patterns select them: ``*.lora_B`` personal with ``A``
  shared (FedSA-LoRA, the method ``fedsa_lora``). ``freeze_a = true`` keeps each ``A`` at its
  seeded first value, held beside the base and not a leaf, so it is neither trained, stored
  per client nor sent (FFA-LoRA). ``fold_adapters = true`` makes each target linear's
  ``weight`` a leaf too (float32, the run's own copy; the shared base stays as loaded), so
  an algorithm can fold a round's adapters into it (FLoRA, the method ``flora``).
* ``mode = "full"``: every parameter of the model is a leaf (full fine-tuning).

``precision = "bf16"`` holds the frozen base in bfloat16, once, while the leaves (the
master adapters) stay float32; ``gradient_checkpointing`` recomputes each layer's
activations in the backward pass. The base's buffers (position ids, rotary frequencies) stay
in the base, so the module has no buffers, as every zoo model.
"""

from __future__ import annotations

import copy
import functools
import math
import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.utils.checkpoint
from torch import nn

from fedforge.core.tree import Params
from fedforge.errors import ConfigError

from .lora import add_lora, export_peft
from .pretrained import TASKS, PretrainedModel, resolve_source

MODES = ("lora", "full")
PRECISIONS = {"float32": torch.float32, "bf16": torch.bfloat16}
ADAPTER_FIELDS = ("r", "lora_alpha", "lora_dropout", "target_modules", "use_rslora",
                  "modules_to_save")
_BASES: dict[tuple, _Held] = {}  # the process's frozen bases, by what they were built from


class _Held:
    """The frozen base of a key, the same object in every copy of the model; pickled as its
    key, so a worker process loads the base once from the folder instead of receiving it."""

    def __init__(self, key: tuple, module: PretrainedModel, leaves: list[str]) -> None:
        self.key, self.module, self.leaves = key, module, leaves

    def __deepcopy__(self, memo: dict) -> _Held:
        return self

    def __reduce__(self) -> tuple:
        return held_base, self.key


def _lora_config(adapters: dict[str, Any]) -> Any:
    unknown = sorted(set(adapters) - set(ADAPTER_FIELDS))
    if unknown:
        raise ConfigError(f"model.options.adapters.{unknown[0]}: unknown field; allowed: "
                          f"{', '.join(ADAPTER_FIELDS)} (PEFT's LoraConfig names)")
    fields = {"r": 8, "lora_alpha": 8, "lora_dropout": 0.0, **adapters}
    if not isinstance(fields["r"], int) or fields["r"] < 1:
        raise ConfigError(f"model.options.adapters.r: expected a positive integer, got "
                          f"{fields['r']!r}")
    if not 0.0 <= float(fields["lora_dropout"]) < 1.0:
        raise ConfigError(f"model.options.adapters.lora_dropout: expected 0 <= p < 1, got "
                          f"{fields['lora_dropout']!r}")
    if not fields.get("target_modules"):
        raise ConfigError("model.options.adapters.target_modules: name the linear layers to "
                          "adapt (e.g. ['query', 'value'] for BERT, ['q_proj', 'v_proj'] "
                          "for Llama)")
    from .lora import _peft  # noqa: PLC0415 (optional extra)

    return _peft().LoraConfig(**fields)


def held_base(path: str, task: str, num_labels: int, mode: str, adapters: tuple,
              precision: str, checkpointing: bool) -> _Held:
    """The process's frozen base for these settings, loaded on first use. A head the folder
    lacks is drawn with seed 0, so every process holds the same base."""
    key = (path, task, num_labels, mode, adapters, precision, checkpointing)
    if torch.empty(0).device.type == "meta":  # a size estimate (core.memory): load nothing
        raise RuntimeError("a pretrained base is not built on the meta device")
    if key not in _BASES:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            base = PretrainedModel((0,), num_labels, path=path, task=task)
            leaves = (add_lora(base, _lora_config(dict(adapters))) if mode == "lora"
                      else [n for n, _ in base.named_parameters()])
        for p in base.parameters():
            if not p.requires_grad:
                p.data = p.data.to(PRECISIONS[precision])
        for b_name, b in list(base.named_buffers()):
            if b.is_floating_point():
                base.get_submodule(b_name.rpartition(".")[0]).register_buffer(
                    b_name.rpartition(".")[2], b.to(PRECISIONS[precision]), persistent=False)
        base.requires_grad_(False)  # every leaf comes from the FineTuned module
        _BASES[key] = _Held(key, base, leaves)
    return _BASES[key]


def _set_leaf(root: nn.Module, name: str, value: torch.Tensor) -> None:
    """Register ``value`` as parameter ``name`` (dotted) of ``root``, making empty modules
    along the way, so ``named_parameters`` gives the base's own names."""
    *path, leaf = name.split(".")
    module = root
    for part in path:
        if not hasattr(module, part):
            module.add_module(part, nn.Module())
        module = getattr(module, part)
    module.register_parameter(leaf, nn.Parameter(value))


class FineTuned(nn.Module):
    """A local pretrained model (``path``) trained through its leaves only; see the module
    docstring. ``forward(tokens [B, T]) -> logits [B, C]`` (a causal LM: the next-token
    logits after the last non-padding token; ``all_positions=True``: every position's)."""

    def __init__(self, input_shape: Sequence[int], num_classes: int, path: str = "",
                 task: str = "classification", mode: str = "lora",
                 adapters: dict[str, Any] | None = None, precision: str = "float32",
                 gradient_checkpointing: bool = False, freeze_a: bool = False,
                 fold_adapters: bool = False) -> None:
        super().__init__()
        del input_shape  # any length up to the model's positions
        if not path:
            raise ConfigError("model.options.path: name the local model folder or .gguf file "
                              "of model 'pretrained'")
        if task not in TASKS:
            raise ConfigError(f"model.options.task: expected one of {TASKS}, got {task!r}")
        if mode not in MODES:
            raise ConfigError(f"model.options.mode: expected one of {MODES}, got {mode!r}")
        if precision not in PRECISIONS:
            raise ConfigError(f"model.options.precision: expected one of "
                              f"{tuple(PRECISIONS)}, got {precision!r}")
        if mode == "full" and precision != "float32":
            raise ConfigError("model.options.precision: 'bf16' holds a frozen base in bf16; "
                              "mode = 'full' freezes nothing (use 'float32')")
        adapters = dict(adapters or {})
        if mode == "lora":
            self.lora_config = _lora_config(adapters)
        elif adapters:
            raise ConfigError("model.options.adapters: set only with mode = 'lora'")
        if freeze_a and mode != "lora":
            raise ConfigError("model.options.freeze_a: set only with mode = 'lora'")
        if fold_adapters and (mode != "lora" or precision != "float32"):
            raise ConfigError("model.options.fold_adapters: set only with mode = 'lora' and "
                              "precision = 'float32' (the target weights become float32 leaves)")
        src = resolve_source(path)
        full_path = str(src.path)
        self.path, self.task, self.mode = full_path, task, mode
        self.num_classes = int(num_classes)
        frozen = tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                              for k, v in adapters.items()))
        self._held = held_base(full_path, task, self.num_classes, mode, frozen, precision,
                               bool(gradient_checkpointing))
        base = self._held.module
        self.pad_id, self.checkpointing = base.pad_id, bool(gradient_checkpointing)
        self.fixed: dict[str, torch.Tensor] = {}  # frozen adapter factors (freeze_a): not leaves
        frozen_a = [n for n in self._held.leaves if freeze_a and n.endswith(".lora_A")]
        self.fold_adapters = bool(fold_adapters)
        leaves = _with_targets(self._held.leaves) if fold_adapters else self._held.leaves
        self.leaf_names = [n for n in leaves if n not in frozen_a]
        # the base's dropout layers (shared, no tensors), so the engines see them and key
        # their masks per client as every zoo model's
        self.dropouts = nn.ModuleList(m for m in base.modules()
                                      if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0)
        for name in leaves:  # in the base's order: the same draws either way
            value = _initial(base, name)
            if name in frozen_a:
                self.fixed[name] = value
            else:
                _set_leaf(self, name, value)

    @property
    def base(self) -> PretrainedModel:
        """The frozen base, shared by every copy of this model in the process."""
        return self._held.module

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._held.module.train(self.training)  # a worker's base is loaded in train mode

    def _apply(self, fn: Any, recurse: bool = True) -> FineTuned:
        super()._apply(fn, recurse)
        self._held.module._apply(fn, recurse)  # the one base follows the model's device
        self.fixed = {n: fn(v) for n, v in self.fixed.items()}
        return self

    def modules(self) -> Iterator[nn.Module]:
        """This module's, then the base's: what inspects the layers (the cost model's FLOP
        count, the input's dtype) sees the network that runs. ``named_modules``, and so
        ``named_parameters``, stays this module's own."""
        yield from super().modules()
        yield from self._held.module.modules()

    def train(self, mode: bool = True) -> FineTuned:
        super().train(mode)
        self._held.module.train(mode)
        return self

    def forward(self, tokens: torch.Tensor, all_positions: bool = False) -> torch.Tensor:
        leaves = {n: functools.reduce(getattr, n.split("."), self) for n in self.leaf_names}
        leaves.update(self.fixed)
        if not self.checkpointing:
            return _run(self._held.module, all_positions, tokens, leaves)
        if torch._C._are_functorch_transforms_active():
            raise ConfigError("model.options.gradient_checkpointing: needs engine.kind = "
                              "'loop' (torch.func's grad and vmap refuse checkpointing)")
        # the recomputation re-enters functional_call with the same leaves (transformers' own
        # checkpointing would recompute over the base's placeholder leaves)
        return torch.utils.checkpoint.checkpoint(_run, self._held.module, all_positions,
                                                 tokens, leaves, use_reentrant=False)

    def forward_all(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits at every position."""
        return self.forward(tokens, all_positions=True)

    def export_peft(self, folder: str | os.PathLike[str], params: Params) -> None:
        """Write ``params`` (this model's leaves, a global or a personal model) as a PEFT
        adapter folder, for ``peft.PeftModel.from_pretrained(base, folder)``."""
        if self.mode != "lora":
            raise ConfigError("export: only a mode = 'lora' model has an adapter to export")
        adapters = {n: params[n].detach().float().cpu() for n in self.leaf_names}
        adapters.update({n: v.detach().float().cpu() for n, v in self.fixed.items()})
        export_peft(folder, self.path, self.lora_config, adapters, self.task,
                    self.num_classes if self.task == "classification" else None)


def _with_targets(leaves: list[str]) -> list[str]:
    """``leaves`` with each adapted linear's ``weight`` just before its ``lora_A``."""
    out = []
    for name in leaves:
        if name.endswith(".lora_A"):
            out.append(name.removesuffix("lora_A") + "weight")
        out.append(name)
    return out


def _run(base: nn.Module, all_positions: bool, tokens: torch.Tensor,
         leaves: Params) -> torch.Tensor:
    kwargs = {"all_positions": True} if all_positions else {}
    return torch.func.functional_call(base, leaves, (tokens,), kwargs)


def _initial(base: nn.Module, name: str) -> torch.Tensor:
    """A leaf's first value: a LoRA factor drawn as PEFT draws it (A Kaiming-uniform from
    the global generator, B zero), anything else the base's float32 value."""
    value = base.get_parameter(name).detach()
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "lora_B":
        return torch.zeros(value.shape, dtype=torch.float32, device=value.device)
    if leaf == "lora_A":
        a = torch.empty(value.shape, dtype=torch.float32, device=value.device)
        return nn.init.kaiming_uniform_(a, a=math.sqrt(5))
    return copy.deepcopy(value).float()
