"""Classic small vision models used by FedAvg / LEAF style benchmarks.

All are buffer-free and use only ops with ``torch.func.vmap`` batching rules, so a whole
client cohort can be run with stacked parameters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from ._utils import conv_out, image_shape


class LogReg(nn.Module):
    """Multinomial logistic regression: flatten + one linear layer (convex baseline)."""

    def __init__(self, input_shape: Sequence[int], num_classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(math.prod(input_shape), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.flatten(1))


class MLP(nn.Module):
    """Fully connected ReLU network; default (200, 200) is FedAvg's "2NN" (199,210 params)."""

    def __init__(
        self,
        input_shape: Sequence[int],
        num_classes: int,
        hidden: Sequence[int] = (200, 200),
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = math.prod(input_shape)
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1))


class CNN(nn.Module):
    """FedAvg/LEAF 2-conv CNN (1,663,370 params on 1x28x28 with 10 classes)."""

    def __init__(
        self,
        input_shape: Sequence[int],
        num_classes: int,
        channels: tuple[int, int] = (32, 64),
        fc: int = 512,
    ) -> None:
        super().__init__()
        c, h, w = image_shape(input_shape, "cnn")
        c1, c2 = channels
        self.features = nn.Sequential(
            nn.Conv2d(c, c1, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        flat = c2 * (h // 4) * (w // 4)
        self.classifier = nn.Sequential(nn.Linear(flat, fc), nn.ReLU(), nn.Linear(fc, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


class LeNet5(nn.Module):
    """LeNet-5 (6/16 channels, 120/84 units) with ReLU and max-pooling (modern variant).

    28x28 inputs get padding 2 on the first conv so both MNIST and CIFAR sizes reach the
    classic 16x5x5 feature map. ``variant="code"`` is FedAST's code
    (``models/FashionMNIST/fl_model.py``): no padding (a 16x4x4 = 256-unit flatten on 28x28)
    and a ReLU on the output logits.
    """

    def __init__(self, input_shape: Sequence[int], num_classes: int,
                 variant: str = "classic") -> None:
        super().__init__()
        if variant not in ("classic", "code"):
            raise ValueError(f"model.options.variant: expected 'classic' or 'code', got "
                             f"{variant!r}")
        c, h, w = image_shape(input_shape, "lenet5")
        pad = 2 if min(h, w) < 32 and variant == "classic" else 0
        self.features = nn.Sequential(
            nn.Conv2d(c, 6, 5, padding=pad),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        fh = conv_out(conv_out(conv_out(conv_out(h, 5, padding=pad), 2, 2), 5), 2, 2)
        fw = conv_out(conv_out(conv_out(conv_out(w, 5, padding=pad), 2, 2), 5), 2, 2)
        self.classifier = nn.Sequential(
            nn.Linear(16 * fh * fw, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, num_classes),
            *([nn.ReLU()] if variant == "code" else []),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


class SimpleCNN(nn.Module):
    """A small CNN: conv5x5(32) - max-pool - conv5x5(64) - max-pool - fc(128) - dropout -
    fc(classes), valid convolutions, ReLU after each hidden layer. pfl-research's own
    ``simple_cnn`` (3x3 convolutions, one pooling) is :class:`PflSimpleCNN`.

    The zoo's model with a random layer: its dropout masks are keyed by (seed, round,
    client) in every engine (:mod:`fedforge.engine.randomness`). Dropout is off in
    evaluation (the module's eval mode). Inputs need at least 16x16 pixels.
    """

    def __init__(self, input_shape: Sequence[int], num_classes: int,
                 channels: tuple[int, int] = (32, 64), fc: int = 128,
                 dropout: float = 0.5) -> None:
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"model.options.dropout: expected 0 <= p < 1, got {dropout!r}")
        c, h, w = image_shape(input_shape, "simple_cnn")
        c1, c2 = channels
        self.features = nn.Sequential(
            nn.Conv2d(c, c1, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 5), nn.ReLU(), nn.MaxPool2d(2),
        )
        fh = conv_out(conv_out(conv_out(conv_out(h, 5), 2, 2), 5), 2, 2)
        fw = conv_out(conv_out(conv_out(conv_out(w, 5), 2, 2), 5), 2, 2)
        self.classifier = nn.Sequential(
            nn.Linear(c2 * fh * fw, fc), nn.ReLU(), nn.Dropout(dropout), nn.Linear(fc, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


class PflSimpleCNN(nn.Module):
    """pfl-research's PyTorch ``simple_cnn`` (its CIFAR-10 benchmark model): conv3x3(32) -
    conv3x3(64) - max-pool - dropout(0.25) - fc(128) - dropout(0.5) - fc(classes), valid
    convolutions, ReLU after each hidden layer, Glorot-uniform weights as pfl-research
    initialises them. 1,626,442 parameters on 32x32 RGB images with 10 classes.

    pfl-research feeds NHWC images and transposes them in the model's first layer; this
    model takes NCHW images like the rest of the zoo. Its dropout masks are keyed as in
    every zoo model (:mod:`fedforge.engine.randomness`).
    """

    def __init__(self, input_shape: Sequence[int], num_classes: int) -> None:
        super().__init__()
        c, h, w = image_shape(input_shape, "pfl_simple_cnn")
        fh, fw = conv_out(conv_out(h, 3), 3) // 2, conv_out(conv_out(w, 3), 3) // 2
        if fh < 1 or fw < 1:
            raise ValueError(f"model.input_shape: pfl_simple_cnn needs at least 6x6 pixels, "
                             f"got {h}x{w}")
        self.features = nn.Sequential(
            nn.Conv2d(c, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
            nn.Dropout(0.25))
        self.classifier = nn.Sequential(
            nn.Linear(64 * fh * fw, 128), nn.ReLU(), nn.Dropout(0.5), nn.Linear(128, num_classes))
        for m in self.modules():
            if isinstance(m, nn.Conv2d | nn.Linear):
                nn.init.xavier_uniform_(m.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))
