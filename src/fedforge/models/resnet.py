"""ResNet-18 with GroupNorm and a CIFAR stem.

BatchNorm is replaced by GroupNorm because running statistics are buffers that cannot be
carried through ``vmap``-ed functional calls and are ill-defined under non-IID clients
(Hsieh et al., 2020).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from ._utils import image_shape


class BasicBlock(nn.Module):
    """Two 3x3 convs with GroupNorm and an identity / 1x1-projection shortcut."""

    def __init__(self, cin: int, cout: int, stride: int, groups: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.gn1 = nn.GroupNorm(groups, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.gn2 = nn.GroupNorm(groups, cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.GroupNorm(groups, cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.gn1(self.conv1(x)))
        out = self.gn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet18GN(nn.Module):
    """ResNet-18 (BasicBlocks [2,2,2,2]), 3x3 stride-1 stem, no max-pool, GroupNorm.

    ``width`` scales all stages (64 gives the standard 11.2M-parameter network); global
    average pooling makes it work on any HxW.
    """

    def __init__(
        self,
        input_shape: Sequence[int],
        num_classes: int,
        groups: int = 2,
        width: int = 64,
        blocks: Sequence[int] = (2, 2, 2, 2),
    ) -> None:
        super().__init__()
        c, _, _ = image_shape(input_shape, "resnet18_gn")
        widths = [width * 2**i for i in range(len(blocks))]
        for wd in widths:
            if wd % groups:
                raise ValueError(f"groups={groups} must divide every stage width {widths}")
        self.conv1 = nn.Conv2d(c, width, 3, padding=1, bias=False)
        self.gn1 = nn.GroupNorm(groups, width)
        stages: list[nn.Module] = []
        cin = width
        for i, (cout, n) in enumerate(zip(widths, blocks, strict=True)):
            stride = 1 if i == 0 else 2
            layer = []
            for j in range(n):
                layer.append(BasicBlock(cin, cout, stride if j == 0 else 1, groups))
                cin = cout
            stages.append(nn.Sequential(*layer))
        self.layers = nn.Sequential(*stages)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.gn1(self.conv1(x)))
        out = self.layers(out)
        return self.fc(out.mean(dim=(-2, -1)))
