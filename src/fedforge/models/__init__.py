"""Model zoo: vmap-friendly (buffer-free, batching-rule-only) models for cohort training.

Every model is built as ``cls(input_shape, num_classes, **kwargs)`` and can be run for a whole
client cohort with ``vmap(functional_call)`` over stacked parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from fedforge.core.memory import check_allocation, module_nbytes

from .convnet import ConvNet
from .finetune import FineTuned
from .pretrained import InstalledModel
from .recurrent import LSTM, CharLSTM
from .resnet import ResNet18GN
from .simple import CNN, MLP, LeNet5, LogReg, PflSimpleCNN, SimpleCNN
from .text import TextClassifier
from .transformer import TransformerLM, TransformerTiny

MODELS: dict[str, tuple[type[nn.Module], str]] = {
    "logreg": (LogReg, "flatten + linear (multinomial logistic regression)"),
    "mlp": (MLP, "flatten + ReLU MLP, default hidden (200, 200) = FedAvg 2NN"),
    "cnn": (CNN, "FedAvg/LEAF 2-conv CNN (32, 64 channels, fc 512)"),
    "lenet5": (LeNet5, "LeNet-5 (6/16 channels, 120/84 units) for 28x28 or 32x32"),
    "simple_cnn": (SimpleCNN, "2 conv 5x5, each with max-pool, fc 128, dropout"),
    "pfl_simple_cnn": (PflSimpleCNN, "pfl-research's simple_cnn (PyTorch): 2 conv 3x3, "
                                     "max-pool, fc 128, dropout 0.25/0.5"),
    "resnet18_gn": (ResNet18GN, "ResNet-18, CIFAR stem, GroupNorm (groups=2)"),
    "convnet": (ConvNet, "dataset-distillation ConvNet: depth x conv-instancenorm-relu-avgpool"),
    "char_lstm": (CharLSTM, "Shakespeare char LSTM: embed 8, 2x LSTM(256), next-char logits"),
    "text_classifier": (TextClassifier, "embedding + masked mean pooling + MLP (SST-2)"),
    "transformer_tiny": (TransformerTiny, "2-layer d64 4-head transformer encoder classifier"),
    "transformer_lm": (TransformerLM, "causal transformer LM, next-token logits (Shakespeare)"),
    "pretrained": (FineTuned, "a local Hugging Face model (options.path), LoRA adapters or "
                              "full fine-tuning (docs/finetuning.md)"),
}


HEADS: dict[str, tuple[str, ...]] = {
    "logreg": ("linear.*",),
    "cnn": ("classifier.2.*",),
    "lenet5": ("classifier.4.*",),
    "simple_cnn": ("classifier.3.*",),
    "pfl_simple_cnn": ("classifier.3.*",),
    "resnet18_gn": ("fc.*",),
    "convnet": ("classifier.*",),
    "char_lstm": ("fc.*",),
    "text_classifier": ("mlp.2.*",),
    "transformer_tiny": ("head.*",),
    "transformer_lm": ("head.*",),
}
"""Each zoo model's head (its final classifier layer) as ``named_parameters`` patterns: the
body/head split of personalised methods (FedPer, FedRep, ...); ``[model] head`` overrides it.
The MLP declares none: the index of its last layer depends on ``hidden``, so its head is the
last layer found in the built model (``fedforge.algorithms.personal.split.last_layer``)."""


def head_patterns(name: str) -> tuple[str, ...] | None:
    """The declared head of zoo model ``name`` (``None`` for a model that declares none)."""
    return HEADS.get(name)



def build_model(
    name: str, input_shape: Sequence[int], num_classes: int, **kwargs: Any
) -> nn.Module:
    """Instantiate a registered model; unknown names raise ``ValueError`` listing choices."""
    try:
        cls, _ = MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; allowed: {', '.join(sorted(MODELS))}") from None
    shape = tuple(int(s) for s in input_shape)
    size = module_nbytes(lambda: cls(shape, int(num_classes), **kwargs))
    if size is not None:  # refuse a model that cannot fit before allocating it
        check_allocation(size[1], f"model.options: {name!r} with {kwargs or 'defaults'}: "
                                  f"{size[0]} parameters")
    return cls(shape, int(num_classes), **kwargs)


def model_rows(installed: Sequence[InstalledModel] = ()) -> list[tuple[str, str]]:
    """``fedforge models``: (name, description) of each registered model, then of each
    installed pretrained one (:func:`~fedforge.models.pretrained.installed_models`)."""
    rows = [(name, entry[1]) for name, entry in sorted(MODELS.items())]
    return rows + [(f"pretrained: {m.name}", m.description) for m in installed]


def num_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Total number of scalar parameters (optionally only those with ``requires_grad``)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


__all__ = [
    "CNN",
    "LSTM",
    "MLP",
    "MODELS",
    "PflSimpleCNN",
    "CharLSTM",
    "ConvNet",
    "LeNet5",
    "LogReg",
    "ResNet18GN",
    "SimpleCNN",
    "TextClassifier",
    "TransformerLM",
    "TransformerTiny",
    "HEADS",
    "build_model",
    "head_patterns",
    "num_parameters",
]
