"""Bag-of-embeddings text classifier (SST-2 style) with padding-aware mean pooling."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

PAD = 0


def masked_mean(h: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Mean of ``h`` [.., T, D] over positions whose token is not padding (id 0).

    All-padding rows yield zeros instead of NaN, so empty client samples cannot poison an
    aggregated update.
    """
    mask = (tokens != PAD).to(h.dtype).unsqueeze(-1)
    return (h * mask).sum(-2) / mask.sum(-2).clamp_min(1.0)


class TextClassifier(nn.Module):
    """Embedding(vocab, 64, padding_idx=0) -> masked mean -> Linear-ReLU(64) -> linear."""

    def __init__(
        self,
        input_shape: Sequence[int],
        num_classes: int,
        vocab_size: int = 10000,
        embed_dim: int = 64,
        hidden: int = 64,
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=PAD)
        self.mlp = nn.Sequential(
            nn.Linear(embed_dim, hidden), nn.ReLU(), nn.Linear(hidden, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(masked_mean(self.embedding(x), x))
