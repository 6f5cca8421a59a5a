"""Functional LoRA over a frozen base, for one client or a whole cohort in one computation.

Settings are PEFT's own ``peft.LoraConfig`` (``r``, ``lora_alpha``, ``lora_dropout``,
``target_modules``, ``use_rslora``, ``modules_to_save``); target modules are matched by
PEFT's own matcher, so a config selects the same layers here and in PEFT. :func:`add_lora`
swaps each target ``nn.Linear`` for :class:`LoraLinear`, which keeps the base's
``weight``/``bias`` names and adds ``lora_A`` [r, in] and ``lora_B`` [out, r]; everything but
the adapters (and the head, where the task needs one) is frozen.

**A cohort as one computation.** The adapter leaves may also be stacked over K clients
(``lora_A`` [K, r, in]): :func:`cohort_logits` then flattens the cohort's tokens [K, B, T]
to one batch [K*B, T] of independent sequences, so every frozen base matmul sees the whole
cohort's tokens at once, and each adapter is applied with ``torch.bmm`` to its own client's
rows (the batch is client-major, so ``x.reshape(K, -1, in)`` is exactly client k's rows).
Attention stays within each sequence, the padding mask is per sequence and built without
a data-dependent branch, and nothing else mixes rows, so no client's loss sees another's
tokens. Whether a layer runs per client or per cohort is read from its adapter's number of
dimensions, a static shape, not from data.

:func:`export_peft` writes an adapter in PEFT's format through PEFT itself, so
``peft.PeftModel.from_pretrained(base, folder)`` loads it.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fedforge.core.tree import Params
from fedforge.errors import ConfigError

from .pretrained import PretrainedModel, load_hf_model
from .real_rows import on_real_rows

LoraConfig = Any  # peft.LoraConfig (the optional extra is imported only when used)
HEAD_MODULES = ("classifier", "score")  # PEFT's modules_to_save for sequence classification
PREFIX = "hf."  # PretrainedModel's attribute holding the transformers model

# LoraConfig fields this module does not implement, with the value that means "off".
_UNSUPPORTED = {"use_dora": False, "bias": "none", "fan_in_fan_out": False,
                "rank_pattern": {}, "alpha_pattern": {}, "layers_to_transform": None,
                "lora_bias": False, "use_qalora": False, "layer_replication": None,
                "trainable_token_indices": None, "init_lora_weights": True}


def _peft() -> Any:
    """peft, the optional extra."""
    try:
        import peft  # noqa: PLC0415
        import peft.tuners.tuners_utils  # noqa: PLC0415
    except ImportError:
        raise ConfigError("lora: adapters need the extra: pip install 'fedforge[pretrained]'"
                          ) from None
    return peft


def per_client_linear(x: torch.Tensor, weight: torch.Tensor,
                      bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias``. A 3-D ``weight`` [K, out, in] is one per client: ``x``'s
    leading rows are K equal client-major blocks, and each block meets its own weight."""
    if weight.dim() == 2:
        return F.linear(x, weight, bias)
    k = weight.shape[0]
    out = torch.bmm(x.reshape(k, -1, x.shape[-1]), weight.transpose(1, 2))
    if bias is not None:
        out = out + (bias[:, None, :] if bias.dim() == 2 else bias)
    return out.reshape(*x.shape[:-1], weight.shape[-2])


class CohortLinear(nn.Module):
    """An ``nn.Linear`` (same parameter names) whose weight may be stacked per client."""

    def __init__(self, base: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.bias = base.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # a float32 head over a bf16 base
        return per_client_linear(x.to(self.weight.dtype), self.weight, self.bias)


class LoraLinear(CohortLinear):
    """Frozen base linear plus ``scaling * B(A(dropout(x)))``, PEFT's LoRA forward and init
    (A Kaiming-uniform, B zero, ``scaling = alpha / r`` or ``alpha / sqrt(r)`` with rsLoRA)."""

    # the frozen base's weight and bias meet only ops bf16 autocast runs in bf16 (a linear;
    # the 3-D per-client path only for a trained weight), so under engine.precision = "bf16"
    # the engine may cast them once per round (fedforge.engine.frozen_casts)
    AUTOCAST_BF16 = ("weight", "bias")

    def __init__(self, base: nn.Linear, r: int, alpha: float, dropout: float,
                 use_rslora: bool = False) -> None:
        super().__init__(base)
        kw = {"dtype": base.weight.dtype, "device": base.weight.device}
        self.lora_A = nn.Parameter(torch.empty(r, self.in_features, **kw))
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, r, **kw))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.scaling = alpha / (math.sqrt(r) if use_rslora else r)
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = _rowwise(lambda v: per_client_linear(v, self.weight, self.bias), x, self.weight)
        h = self.lora_dropout(x.to(self.lora_A.dtype))  # on every row: the same masks
        delta = _rowwise(lambda v: per_client_linear(per_client_linear(v, self.lora_A),
                                                     self.lora_B), h, self.lora_A)
        return out + (delta * self.scaling).to(out.dtype)


def _rowwise(fn: Any, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``fn(x)`` on the batch's real rows (:mod:`.real_rows`) where ``weight`` is one for
    every row; a per-client weight needs its clients' row blocks whole."""
    return on_real_rows(fn, x) if weight.dim() == 2 else fn(x)


def _check_config(config: LoraConfig) -> None:
    for field, off in _UNSUPPORTED.items():
        value = getattr(config, field, off)
        if value != off and value not in (None, {}, []):
            raise ConfigError(f"lora.{field}: {value!r} is not supported (only plain LoRA; "
                              f"expected {off!r})")
    if config.target_modules is None:
        raise ConfigError("lora.target_modules: name the modules to adapt (e.g. "
                          "['query', 'value'])")


def _root(model: nn.Module) -> tuple[nn.Module, str]:
    """The transformers model inside a :class:`PretrainedModel` and its name prefix."""
    return (model.hf, PREFIX) if isinstance(model, PretrainedModel) else (model, "")


def add_lora(model: nn.Module, config: LoraConfig, train_head: bool | None = None) -> list[str]:
    """Freeze ``model`` and add LoRA to its target linears, in place; returns the trainable
    parameter names. ``train_head`` (default: for a classification model) also trains the
    head, ``config.modules_to_save`` or else transformers' ``classifier``/``score``."""
    check_target_module_exists = _peft().tuners.tuners_utils.check_target_module_exists
    _check_config(config)
    root, prefix = _root(model)
    if train_head is None:
        train_head = getattr(model, "task", "classification") == "classification"
    heads = tuple(config.modules_to_save or HEAD_MODULES) if train_head else ()
    for p in model.parameters():
        p.requires_grad_(False)
    targets = [n for n, m in root.named_modules()
               if isinstance(m, nn.Linear) and check_target_module_exists(config, n)]
    if not targets:
        raise ConfigError(f"lora.target_modules: {config.target_modules!r} matches no linear "
                          "layer of the model")
    for name in targets:
        root.set_submodule(name, LoraLinear(root.get_submodule(name), config.r,
                                            config.lora_alpha, config.lora_dropout,
                                            config.use_rslora))
    head_names = [n for n, m in root.named_modules() if n.split(".")[-1] in heads]
    if train_head and not head_names:
        raise ConfigError(f"lora.modules_to_save: no module named {heads} to train as the head")
    for name in head_names:
        module = root.get_submodule(name)
        if not isinstance(module, nn.Linear):
            raise ConfigError(f"lora.modules_to_save: {name!r} is a {type(module).__name__}, "
                              "not a linear head")
        root.set_submodule(name, CohortLinear(module))
    for name, p in root.named_parameters():
        is_head = any(name.startswith(h + ".") for h in head_names)
        p.requires_grad_(is_head or name.rsplit(".", 1)[-1] in ("lora_A", "lora_B"))
    return [prefix + n for n, p in root.named_parameters() if p.requires_grad]


def adapter_params(model: nn.Module) -> Params:
    """The trainable leaves (adapters and head), detached: a client's state."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def stack_adapters(adapters: Sequence[Params]) -> Params:
    """K clients' adapters stacked on a new leading axis (the cohort's leaves)."""
    return {k: torch.stack([a[k] for a in adapters]) for k in adapters[0]}


def cohort_logits(model: nn.Module, adapters: Params, tokens: torch.Tensor,
                  all_positions: bool = False) -> torch.Tensor:
    """Logits [K, B, ...] of K clients' token batches [K, B, T] in one forward pass over the
    frozen base held by ``model``; ``adapters`` are stacked [K, ...] (:func:`stack_adapters`).
    The base is not copied: only the adapters are passed to ``functional_call``."""
    k, b = tokens.shape[:2]
    flat = tokens.reshape(k * b, *tokens.shape[2:])
    kwargs = {"all_positions": True} if all_positions else {}
    out = torch.func.functional_call(model, adapters, (flat,), kwargs)
    return out.reshape(k, b, *out.shape[1:])


def cohort_losses(model: nn.Module, adapters: Params, tokens: torch.Tensor,
                  labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Each client's masked mean cross-entropy [K] (``sum w CE / max(sum w, 1)``, the
    engine's loss) from one cohort forward; their sum's gradient w.r.t. client k's adapter
    is client k's own gradient, since its adapter touches only its rows."""
    logits = cohort_logits(model, adapters, tokens)  # [K, B, C]
    ce = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="none")
    ce = ce.view_as(weights)
    return (ce * weights).sum(-1) / weights.sum(-1).clamp_min(1.0)


def _peft_name(name: str, heads: Sequence[str]) -> str:
    """Our leaf name -> the PEFT model's parameter name (adapter ``default``)."""
    path = name.removeprefix(PREFIX)
    module, leaf = path.rsplit(".", 1)
    if leaf in ("lora_A", "lora_B"):
        return f"base_model.model.{module}.{leaf}.default.weight"
    head = next((h for h in heads if path.startswith(h + ".")), None)
    if head is None:
        raise ConfigError(f"export: {name!r} is neither a LoRA factor nor a head parameter")
    return f"base_model.model.{head}.modules_to_save.default.{path[len(head) + 1:]}"


def to_peft(base: nn.Module, config: LoraConfig, adapters: Params, task: str) -> Any:
    """A ``peft.PeftModel`` over ``base`` (a transformers model) holding ``adapters``."""
    cfg = copy.deepcopy(config)
    cfg.task_type = "SEQ_CLS" if task == "classification" else "CAUSAL_LM"
    heads = sorted({n.removeprefix(PREFIX).split(".")[0] for n in adapters
                    if n.rsplit(".", 1)[-1] not in ("lora_A", "lora_B")})
    cfg.modules_to_save = heads or None
    peft_model = _peft().get_peft_model(base, cfg)
    named = dict(peft_model.named_parameters())
    filled = set()
    for name, tensor in adapters.items():
        target = _peft_name(name, heads)
        if target not in named:
            raise ConfigError(f"export: {name!r} has no counterpart {target!r} in PEFT's model")
        with torch.no_grad():
            named[target].copy_(tensor)
        filled.add(target)
    missing = [n for n, p in named.items() if p.requires_grad and n not in filled]
    if missing:
        raise ConfigError(f"export: the adapter lacks {len(missing)} of PEFT's trainable "
                          f"tensors, first {missing[0]!r}")
    return peft_model


def export_peft(folder: str | os.PathLike[str], base_path: str | os.PathLike[str],
                config: LoraConfig, adapters: Params, task: str = "classification",
                num_labels: int | None = None) -> Path:
    """Write ``adapters`` as PEFT's ``adapter_config.json`` + ``adapter_model.safetensors``
    in ``folder``, for ``PeftModel.from_pretrained(base, folder)``. A classification
    adapter must hold its head: the base folder's head is freshly drawn at each load."""
    if task == "classification" and not any(
            n.removeprefix(PREFIX).split(".")[0] in HEAD_MODULES for n in adapters):
        raise ConfigError("export: a classification adapter needs its head "
                          f"({' or '.join(HEAD_MODULES)}); train it with the adapter")
    base = load_hf_model(base_path, task, num_labels)
    cfg = copy.deepcopy(config)
    cfg.base_model_name_or_path = str(Path(base_path).expanduser().resolve())
    out = Path(folder)
    to_peft(base, cfg, adapters, task).save_pretrained(out)
    return out
