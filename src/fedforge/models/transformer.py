"""Small pre-LN transformer encoder (classification) and causal LM for token inputs.

Attention is written with plain matmul/softmax: ``nn.MultiheadAttention`` dispatches to
fused SDPA kernels without vmap batching rules, which would fall back to a slow per-client
loop inside ``vmap``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from ._utils import seq_len
from .text import PAD, masked_mean


class SelfAttention(nn.Module):
    """Multi-head self-attention with a fused QKV projection and an optional boolean mask."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model={d_model} not divisible by heads={heads}")
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """``x`` [B, T, D]; ``mask`` broadcastable to [B, heads, T, T], True = may attend."""
        b, t, d = x.shape
        qkv = self.qkv(x).reshape(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each [B, H, T, dh]
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        if mask is not None:
            # A finite fill keeps fully-masked (all-padding) rows NaN-free.
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        att = torch.softmax(scores, dim=-1)
        y = torch.matmul(att, v).transpose(1, 2).reshape(b, t, d)
        return self.out(y)


class Block(nn.Module):
    """Pre-LN block: x + attn(LN(x)); x + MLP(LN(x)). ``post_norm``: LN(x + attn(x)), then
    LN(x + MLP(x)) (``nn.TransformerEncoderLayer``'s default, used by FedNAR's Shakespeare
    model). The MLP activation is GELU or ReLU."""

    def __init__(
        self, d_model: int, heads: int, mlp_ratio: int, post_norm: bool = False,
        activation: str = "gelu",
    ) -> None:
        super().__init__()
        if activation not in ("gelu", "relu"):
            raise ValueError(f"activation: expected 'gelu' or 'relu', got {activation!r}")
        self.post_norm = post_norm
        self.act = F.gelu if activation == "gelu" else F.relu
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, mlp_ratio * d_model)
        self.fc2 = nn.Linear(mlp_ratio * d_model, d_model)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if self.post_norm:
            x = self.ln1(x + self.attn(x, mask))
            return self.ln2(x + self.fc2(self.act(self.fc1(x))))
        x = x + self.attn(self.ln1(x), mask)
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


class _Encoder(nn.Module):
    """Token + learned position embeddings followed by a stack of blocks and a final LN."""

    def __init__(
        self, vocab_size: int, max_len: int, d_model: int, heads: int, layers: int, mlp_ratio: int,
        post_norm: bool = False, activation: str = "gelu", embed_scale: float = 1.0,
    ) -> None:
        super().__init__()
        self.max_len, self.embed_scale = max_len, embed_scale
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.tok.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)
        self.blocks = nn.ModuleList(
            Block(d_model, heads, mlp_ratio, post_norm, activation) for _ in range(layers)
        )
        # a post-norm stack ends in a LayerNorm already (nn.TransformerEncoder has no final one)
        self.ln_f = nn.Identity() if post_norm else nn.LayerNorm(d_model)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        t = tokens.shape[-1]
        if t > self.max_len:
            raise ValueError(f"sequence length {t} exceeds max_len {self.max_len}")
        h = self.tok(tokens) * self.embed_scale + self.pos.weight[:t]
        for block in self.blocks:
            h = block(h, mask)
        return self.ln_f(h)


class TransformerTiny(nn.Module):
    """2-layer, d_model 64, 4-head encoder with masked mean pooling (padding id 0)."""

    def __init__(
        self,
        input_shape: Sequence[int],
        num_classes: int,
        vocab_size: int = 10000,
        d_model: int = 64,
        heads: int = 4,
        layers: int = 2,
        mlp_ratio: int = 4,
        max_len: int | None = None,
    ) -> None:
        super().__init__()
        max_len = max_len or seq_len(input_shape, "transformer_tiny")
        self.encoder = _Encoder(vocab_size, max_len, d_model, heads, layers, mlp_ratio)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = (x != PAD)[:, None, None, :]  # keys: [B, 1, 1, T]
        return self.head(masked_mean(self.encoder(x, mask), x))


class TransformerLM(nn.Module):
    """Causal transformer LM (default 6 layers as in FedNAR's Shakespeare setup).

    ``forward`` returns next-token logits from the last position ``[B, num_classes]``;
    :meth:`forward_all` returns them for every position ``[B, T, num_classes]``.

    FedNAR's Shakespeare model (ljb121002/fednar ``util_models.py``) is
    ``d_model=128, heads=4, layers=6, mlp_ratio=4, post_norm=True, activation="relu",
    embed_scale=128**0.5, causal=False``: 6 bidirectional post-norm encoder layers, the last
    position's output classified. Its dropout 0.1 is not modelled (deterministic steps).
    """

    def __init__(
        self,
        input_shape: Sequence[int],
        num_classes: int,
        vocab_size: int = 80,
        d_model: int = 64,
        heads: int = 4,
        layers: int = 6,
        mlp_ratio: int = 4,
        max_len: int | None = None,
        post_norm: bool = False,
        activation: str = "gelu",
        embed_scale: float = 1.0,
        causal: bool = True,
    ) -> None:
        super().__init__()
        max_len = max_len or seq_len(input_shape, "transformer_lm")
        self.causal = causal
        self.encoder = _Encoder(vocab_size, max_len, d_model, heads, layers, mlp_ratio,
                                post_norm, activation, embed_scale)
        self.head = nn.Linear(d_model, num_classes)

    def _hidden(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[-1]
        if not self.causal:
            return self.encoder(x, None)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        return self.encoder(x, causal)

    def forward_all(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self._hidden(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self._hidden(x)[:, -1])
