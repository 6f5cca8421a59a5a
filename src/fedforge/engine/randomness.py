"""Random layers keyed by (seed, round, client): the same dropout masks in every engine.

torch's dropout draws from the process's global generator. That breaks every promise an
engine makes: worker processes (``procs``) each hold their own generator, so a run differs
from itself; ``vmap`` refuses random operations, and with ``randomness="different"`` it would
draw one cohort-shaped tensor that no per-client loop can reproduce; and a resumed run would
need the generator's state. So dropout here is not drawn: its mask is a counter-based hash
(:mod:`fedforge.comm.rng`) of the client's key, the local step, the dropout call's position
in the forward pass and the element's index. Integer arithmetic gives the same bits in one
client's loop, under ``vmap`` (the key is then batched over clients), in a worker process
and on a GPU.

The key of client ``i`` in round ``t`` is :func:`client_keys` of ``(seed, t, i)``;
:func:`~fedforge.engine.round.federated_round` puts it into the round inputs under
:data:`CLIENT_KEY`, and the local update's ``dropout`` stage
(:func:`~fedforge.engine.stages.dropout_keys`) enters
:class:`KeyedRandomness` around each step's forward and backward pass. Only models with
dropout layers (``p > 0``) pay for the mode. Other random layers (``RReLU``, alpha dropout)
and random functions called inside ``forward`` cannot be keyed: the engine refuses them in
one line (:class:`RandomLayerError`) rather than train with masks it cannot reproduce.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from fedforge.comm.rng import as_int32, hash_u32, mix32, stream_key
from fedforge.engine.rounding import STOCHASTIC
from fedforge.models.real_rows import padded_elements

CLIENT_KEY = "client_key"  # round input: the client's 32-bit dropout key (int64 [C])
INT32_INDICES = 2**31  # dropout calls with fewer elements hash int32 words
KEYED_MODULES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d)
UNKEYED_MODULES = (nn.RReLU, nn.AlphaDropout, nn.FeatureAlphaDropout)
_DROPOUT = {F.dropout: 0, torch.dropout: 0, F.dropout1d: 1, F.dropout2d: 2, F.dropout3d: 3}
_RANDOM = {
    torch.rand, torch.rand_like, torch.randn, torch.randn_like, torch.randint,
    torch.randint_like, torch.randperm, torch.bernoulli, torch.multinomial, torch.normal,
    torch.poisson, torch.Tensor.bernoulli, torch.Tensor.bernoulli_, torch.Tensor.multinomial,
    torch.Tensor.uniform_, torch.Tensor.normal_, torch.Tensor.exponential_,
    torch.Tensor.geometric_, torch.Tensor.cauchy_, torch.Tensor.log_normal_,
    torch.Tensor.random_, F.rrelu, F.rrelu_, torch.rrelu, torch.rrelu_, F.alpha_dropout,
    F.feature_alpha_dropout, torch.alpha_dropout, torch.feature_alpha_dropout,
    torch.feature_dropout, torch.dropout_, torch.feature_dropout_,
}


class RandomLayerError(ValueError):
    """A model draws random numbers that an engine cannot key per client (one line)."""


def client_keys(seed: int, round_: int, client_ids: torch.Tensor) -> torch.Tensor:
    """The clients' 32-bit dropout keys for round ``round_`` (int64 ``[C]``, on the ids'
    device): a function of (seed, round, client id) only, so a resumed run and every engine
    draw the same masks, and a client's masks do not depend on who else was sampled."""
    base = int(np.random.SeedSequence([int(seed), int(round_), 0x64726F70]).generate_state(1)[0])
    return mix32(mix32(client_ids.to(torch.int64)) ^ base)


def job_keys(seed: int, task: int, job_ids: list[int]) -> torch.Tensor:
    """Dropout keys of asynchronous jobs: a function of (seed, task, job id) only."""
    return torch.stack([stream_key(int(seed), 0x6A6F62, int(task), int(j)) for j in job_ids])


def keyed_layers(model: nn.Module) -> list[str]:
    """Names of the dropout layers (``p > 0``) whose masks the engines key per client."""
    return [name for name, m in model.named_modules()
            if isinstance(m, KEYED_MODULES) and m.p > 0]


def unkeyed_layer(model: nn.Module) -> tuple[str, str] | None:
    """``(name, type)`` of the first random layer that cannot be keyed, or None."""
    for name, m in model.named_modules():
        if isinstance(m, UNKEYED_MODULES):
            return name, type(m).__name__
    return None


def loss_model(loss_fn: Callable) -> nn.Module | None:
    """The model a loss runs (the classification loss's), or None for another loss."""
    model = getattr(loss_fn, "model", None)
    return model if isinstance(model, nn.Module) else None


def is_keyed(loss_fn: Callable) -> bool:
    """Whether the loss's model has dropout layers, so local steps run keyed."""
    model = loss_model(loss_fn)
    return model is not None and bool(keyed_layers(model))


def needs_client_key(loss_fn: Callable) -> bool:
    """Whether local steps draw keyed bits: dropout masks, or bf16's stochastic rounding."""
    return is_keyed(loss_fn) or getattr(loss_fn, "precision", None) == STOCHASTIC


def check_random_layers(loss_fn: Callable, engine: str) -> None:
    """Refuse, in one line naming the engine and the layer, a model with a random layer
    that cannot be keyed per client."""
    model = loss_model(loss_fn)
    found = unkeyed_layer(model) if model is not None else None
    if found is not None:
        name, kind = found
        raise RandomLayerError(
            f"engine {engine}: model layer {name!r} ({kind}) draws random numbers that "
            f"cannot be keyed by (seed, round, client); only dropout layers (nn.Dropout, "
            f"nn.Dropout1d/2d/3d) can, so remove the layer or replace it with one of them")


def dropout_mask(key: torch.Tensor, stream: int, shape: tuple[int, ...], p: float,
                 device: torch.device,
                 elements: tuple[torch.Tensor, int] | None = None) -> torch.Tensor:
    """Keep-mask of one dropout call (``True``: kept, probability ``1 - p``): bit ``i`` from
    the hash of element ``i`` under ``(key, stream)``. ``key`` may be batched under vmap.
    ``elements``: the elements' indices in a larger layout and its size (a packed batch's
    real rows in the padded one, :func:`fedforge.models.real_rows.padded_elements`), so the
    mask is that layout's.

    The hash runs on int32 words (the same bits as on int64, several times faster) unless
    the call has :data:`INT32_INDICES` elements or more."""
    index, n = elements if elements is not None else (None, int(np.prod(shape, dtype=np.int64)))
    key = mix32(key.to(device) ^ stream)
    words = n < INT32_INDICES
    dtype = torch.int32 if words else torch.int64
    idx = (torch.arange(n, dtype=dtype, device=device).view(shape) if index is None
           else index.to(device=device, dtype=dtype))
    h = hash_u32(as_int32(key) if words else key, idx)
    bits = (h >> 8) & 0xFFFFFF  # 24 uniform bits (the mask undoes int32's sign extension)
    return bits >= int(round(p * 2**24))


class KeyedRandomness(TorchFunctionMode):
    """Inside: every dropout call of the forward pass draws its mask from ``(key, step,
    call)``; any other random function raises :class:`RandomLayerError` naming ``engine``."""

    def __init__(self, key: torch.Tensor, step: int, engine: str) -> None:
        super().__init__()
        self.key, self.step, self.engine, self.calls = key, step, engine, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _DROPOUT:
            return self._dropout(_DROPOUT[func], *args, **kwargs)
        if func in _RANDOM:
            name = getattr(func, "__name__", str(func))
            raise RandomLayerError(
                f"engine {self.engine}: the model calls {name} in its forward pass, which "
                f"cannot be keyed by (seed, round, client); use dropout layers (nn.Dropout, "
                f"nn.Dropout1d/2d/3d), whose masks are keyed")
        return func(*args, **kwargs)

    def _dropout(self, spatial: int, input: torch.Tensor, p: float = 0.5,
                 training: bool = True, inplace: bool = False, *, train: bool | None = None
                 ) -> torch.Tensor:
        """``F.dropout`` (``spatial = 0``) or ``F.dropoutNd``: a whole channel per mask bit."""
        training = training if train is None else train
        if not training or p == 0:
            return input
        if p == 1:
            return input * 0
        shape = tuple(input.shape)
        if spatial:  # [N, C, *spatial] or [C, *spatial]: one bit per channel
            shape = shape[: len(shape) - spatial] + (1,) * spatial
        stream = (self.step << 16) ^ self.calls
        self.calls += 1
        elements = None if spatial else padded_elements(shape)
        keep = dropout_mask(self.key, stream, shape, float(p), input.device, elements)
        return input * keep.to(input.dtype) * (1.0 / (1.0 - p))


def no_key(device: torch.device | str = "cpu") -> torch.Tensor:
    """The key of a client whose round inputs carry none (a caller outside the rounds)."""
    return torch.zeros((), dtype=torch.int64, device=device)


def vmap_refusal(exc: RuntimeError, engine: str) -> RandomLayerError | None:
    """vmap's multi-line error for a random operation, as one line naming the engine."""
    if "randomness" not in str(exc) or "vmap" not in str(exc):
        return None
    return RandomLayerError(
        f"engine {engine}: the model draws random numbers outside its dropout layers, which "
        f"vmap cannot key per client; use dropout layers (nn.Dropout, nn.Dropout1d/2d/3d), "
        f"whose masks are keyed, or the loop engine")
