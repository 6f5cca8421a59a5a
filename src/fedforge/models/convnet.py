"""ConvNet of the dataset-distillation literature (conv-instancenorm-relu-avgpool blocks).

Instance norm is expressed as ``GroupNorm(width, width)`` (affine), which has no running
statistics and therefore stays vmap/functional_call friendly.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ._utils import image_shape


class ConvNet(nn.Module):
    """``depth`` x [conv3x3(width) - GroupNorm(width, width) - ReLU - AvgPool2] + linear."""

    def __init__(
        self,
        input_shape: Sequence[int],
        num_classes: int,
        depth: int = 3,
        width: int = 128,
    ) -> None:
        super().__init__()
        c, h, w = image_shape(input_shape, "convnet")
        layers: list[nn.Module] = []
        for _ in range(depth):
            layers += [
                nn.Conv2d(c, width, 3, padding=1),
                nn.GroupNorm(width, width, affine=True),
                nn.ReLU(),
                nn.AvgPool2d(2),
            ]
            c, h, w = width, h // 2, w // 2
        if h < 1 or w < 1:
            raise ValueError(f"convnet depth {depth} too deep for input {tuple(input_shape)}")
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(c * h * w, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))
