"""Character LSTM for Shakespeare (LEAF / FedAvg next-character prediction).

``nn.LSTM`` dispatches to fused ``_VF``/cuDNN kernels that have no vmap batching rule, so the
recurrence is written out with matmuls. Parameter names and the gate order (i, f, g, o)
match ``nn.LSTM(batch_first=True)``, so its state dict loads directly into :class:`LSTM`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn


class LSTM(nn.Module):
    """Multi-layer unidirectional LSTM, batch-first, zero initial state.

    The input projection of a layer is one matmul over all time steps; each step then needs a
    single fused ``h @ W_hh^T`` for the four gates.
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1) -> None:
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        for k in range(num_layers):
            fan_in = input_size if k == 0 else hidden_size
            self.register_parameter(
                f"weight_ih_l{k}", nn.Parameter(torch.empty(4 * hidden_size, fan_in))
            )
            self.register_parameter(
                f"weight_hh_l{k}", nn.Parameter(torch.empty(4 * hidden_size, hidden_size))
            )
            self.register_parameter(f"bias_ih_l{k}", nn.Parameter(torch.empty(4 * hidden_size)))
            self.register_parameter(f"bias_hh_l{k}", nn.Parameter(torch.empty(4 * hidden_size)))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Same init as ``nn.LSTM``: U(-1/sqrt(H), 1/sqrt(H)) for every tensor."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map ``[B, T, input_size]`` to the top layer's hidden states ``[B, T, hidden]``."""
        out = x
        for k in range(self.num_layers):
            w_ih = getattr(self, f"weight_ih_l{k}")
            w_hh = getattr(self, f"weight_hh_l{k}")
            bias = getattr(self, f"bias_ih_l{k}") + getattr(self, f"bias_hh_l{k}")
            proj = torch.matmul(out, w_ih.t()) + bias  # [B, T, 4H]
            h = proj.new_zeros(proj.shape[:-2] + (self.hidden_size,))
            c = h
            hs = []
            for xt in proj.unbind(-2):
                gates = xt + torch.matmul(h, w_hh.t())
                i, f, g, o = gates.chunk(4, dim=-1)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                h = torch.sigmoid(o) * torch.tanh(c)
                hs.append(h)
            out = torch.stack(hs, dim=-2)
        return out


class CharLSTM(nn.Module):
    """Embedding(vocab, 8) -> 2-layer LSTM(256) -> linear; logits for the next character.

    Input: int64 ``[B, T]``; output ``[B, num_classes]`` from the last time step.
    """

    def __init__(
        self,
        input_shape: Sequence[int],
        num_classes: int,
        vocab_size: int = 80,
        embed_dim: int = 8,
        hidden: int = 256,
        layers: int = 2,
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.lstm = LSTM(embed_dim, hidden, layers)
        self.fc = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.lstm(self.embedding(x))[..., -1, :])
