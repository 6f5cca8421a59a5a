"""Uplink codecs: how a client's delta becomes a message and how the server reads the mean.

The hook (wired in :mod:`fedforge.engine.local`, :mod:`fedforge.engine.base` and
:mod:`fedforge.engine.round`) is, per round t::

    client i:  message_i, state_i = codec.encode(delta_i, state_i, ctx)   # inside local_update
    engine:    mean_message = sum_i w_i message_i                          # aggregation weights
    server:    mean_delta, codec_server_state = codec.decode(mean_message, state, params, t)
               -> the algorithm's server optimizer, as for an uncompressed run

Linear codecs (sketches) average in sketch space and desketch once; for sparsifiers and
quantisers the message is the dense simulated reconstruction, so the mean is exact.
``nbytes(params, t)`` is the exact size of one client's wire message (values + indices +
seeds), which :meth:`fedforge.protocol.algorithm.Algorithm.message_nbytes` reports.
Client codec state (error-feedback residuals, MARINA's last delta) lives in the client store
under the key ``"codec"``; server state under ``server_state["codec"]``.
"""

from __future__ import annotations

import torch

from fedforge.comm import compress as C
from fedforge.comm.rng import stream_key
from fedforge.comm.sketch import CountSketch, Sketch, make_sketch, sketch_size
from fedforge.core.tree import Params


def flatten(tree: Params) -> torch.Tensor:
    """Concatenate the leaves (dict order) into one vector (per client under vmap)."""
    return torch.cat([t.reshape(-1) for t in tree.values()])


def unflatten(vec: torch.Tensor, like: Params) -> Params:
    out, i = {}, 0
    for name, t in like.items():
        out[name] = vec[i: i + t.numel()].reshape(t.shape).to(t.dtype)
        i += t.numel()
    return out


def numel(params: Params) -> int:
    return sum(t.numel() for t in params.values())


def zeros_flat(params: Params) -> torch.Tensor:
    """A flat zero vector with the model's size, dtype and device (codec state)."""
    first = next(iter(params.values()))
    return torch.zeros(numel(params), dtype=first.dtype, device=first.device)


def _round(ctx) -> torch.Tensor:
    return ctx.broadcast["round"]


class Codec:
    """Identity codec (base class): the message is the flat fp32 delta, 4d bytes."""

    name = "identity"

    def client_init(self, params: Params) -> dict:
        return {}

    def server_init(self, params: Params) -> dict:
        return {}

    def round_info(self, num_sampled: int, generator: torch.Generator) -> dict:
        return {}

    def encode(self, delta: Params, state: dict, ctx) -> tuple[dict, dict]:
        return {"v": flatten(delta)}, state

    def decode(self, mean_message: dict, state: dict, params: Params,
               round_: int) -> tuple[Params, dict]:
        return unflatten(mean_message["v"], params), state

    def nbytes(self, params: Params, round_: int | None = None) -> int:
        return 4 * numel(params)


class SketchCodec(Codec):
    """SAFL's uplink: ``sk_t(delta)`` with a fresh shared ``R_t`` per round; b numbers + seed."""

    name = "sketch"

    def __init__(self, kind: str = "srht", size: int | None = None,
                 ratio: float | None = None, seed: int = 0, rows: int = 1) -> None:
        if size is None and ratio is None:
            raise ValueError("sketch_size / compression: give one of them")
        self.kind, self.size, self.ratio, self.seed, self.rows = kind, size, ratio, seed, rows
        make_sketch(kind, 4, 1, seed, rows)  # validates kind early
        self._ops: dict[int, Sketch] = {}

    def op(self, d: int) -> Sketch:
        if d not in self._ops:
            b = d if self.kind == "identity" else sketch_size(d, self.size, self.ratio)
            self._ops[d] = make_sketch(self.kind, d, b, self.seed, self.rows)
        return self._ops[d]

    def encode(self, delta, state, ctx):
        v = flatten(delta)
        return {"y": self.op(v.numel()).sketch(v, _round(ctx))}, state

    def decode(self, mean_message, state, params, round_):
        u = self.op(numel(params)).desketch(mean_message["y"], round_)
        return unflatten(u, params), state

    def nbytes(self, params, round_=None):
        op = self.op(numel(params))
        return 4 * numel(params) if self.kind == "identity" else 4 * op.numel + 8


class CompressCodec(Codec):
    """top-k / random-k / QSGD / scaled sign, optionally with error feedback.

    With ``error_feedback``: ``p = delta + e``, send ``C(p)``, keep ``e <- p - C(p)``
    (Seide et al. 2014; Karimireddy et al. 2019), so sent + residual = p every round.
    """

    name = "compress"

    def __init__(self, method: str = "topk", k: int | None = None,
                 ratio: float | None = None, levels: int = 16,
                 error_feedback: bool = False, seed: int = 0) -> None:
        if method not in C.METHODS:
            raise ValueError(f"compressor: unknown method {method!r}; expected one of "
                             f"{C.METHODS}")
        if method == "qsgd" and int(levels) < 1:
            raise ValueError(f"levels: expected an int >= 1, got {levels!r}")
        if method in ("topk", "randk") and k is None and ratio is None:
            raise ValueError("k / compression: give one of them for top-k and random-k")
        self.method, self.k, self.ratio, self.levels = method, k, ratio, int(levels)
        self.ef, self.seed = bool(error_feedback), int(seed)

    def _k(self, d: int) -> int:
        return C.count_k(d, self.k, self.ratio) if self.method in ("topk", "randk") else 0

    def client_init(self, params):
        return {"residual": zeros_flat(params)} if self.ef else {}

    def round_info(self, num_sampled, generator):
        if self.method != "qsgd":
            return {}
        return {"codec_key": torch.randint(0, 2**32, (num_sampled,), generator=generator)}

    def compress(self, v: torch.Tensor, ctx) -> torch.Tensor:
        d = v.shape[-1]
        if self.method == "topk":
            return C.topk(v, self._k(d))
        if self.method == "randk":
            return C.randk(v, self._k(d), stream_key(self.seed, _round(ctx).to(torch.int64)),
                           unbiased=not self.ef)
        if self.method == "qsgd":
            key = stream_key(self.seed, ctx.info["codec_key"])
            return C.qsgd(v, self.levels, key)
        return C.scaled_sign(v)

    def encode(self, delta, state, ctx):
        v = flatten(delta)
        if self.ef:
            v = v + state["residual"]
        sent = self.compress(v, ctx)
        return {"v": sent}, ({"residual": v - sent} if self.ef else state)

    def nbytes(self, params, round_=None):
        d = numel(params)
        return C.compressed_nbytes(self.method, d, self._k(d), self.levels)


class MarinaCodec(Codec):
    """MARINA (Gorbunov et al. 2021) on deltas: with probability ``p`` (a coin shared by all
    clients and the server from (seed, round); always in round 1) everyone sends the full
    delta and ``g = mean delta``; otherwise clients send ``Q(delta_i - delta_i^prev)``
    (unbiased random-k) and ``g <- g + mean Q(...)``. Needs full participation."""

    name = "marina"

    def __init__(self, k: int | None = None, ratio: float | None = None, p: float = 0.1,
                 seed: int = 0) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"sync_prob: expected a probability in [0, 1], got {p!r}")
        self.q = CompressCodec("randk", k, ratio, seed=seed)
        self.p, self.seed = float(p), int(seed)

    def full_sync(self, round_) -> torch.Tensor:
        r = round_.to(torch.int64) if isinstance(round_, torch.Tensor) else torch.tensor(round_)
        from fedforge.comm.rng import uniform  # noqa: PLC0415
        u = uniform(stream_key(self.seed, r, 77), torch.zeros((), dtype=torch.int64))
        return (r <= 1) | (u < self.p)

    def client_init(self, params):
        return {"prev": zeros_flat(params)}

    def server_init(self, params):
        return {"g": zeros_flat(params)}

    def encode(self, delta, state, ctx):
        v = flatten(delta)
        full = self.full_sync(_round(ctx)).to(v.device)
        msg = torch.where(full, v, self.q.compress(v - state["prev"], ctx))
        return {"v": msg}, {"prev": v}

    def decode(self, mean_message, state, params, round_):
        m = mean_message["v"]
        g = torch.where(self.full_sync(round_).to(m.device), m, state["g"].to(m.device) + m)
        return unflatten(g, params), {"g": g}

    def nbytes(self, params, round_=None):
        full = round_ is None or bool(self.full_sync(int(round_)))
        return 4 * numel(params) if full else self.q.nbytes(params)


class FetchSGDCodec(Codec):
    """FetchSGD (Rothchild et al. 2020): clients send a count sketch of their delta (the same
    hashes every round, since server state lives in sketch space); the server keeps
    momentum ``S_u <- rho S_u + S`` and error ``S_e <- S_e + lr S_u`` as sketches, unsketches
    the top-k heavy hitters of ``S_e`` (median estimate), applies them, and removes them
    from the sketches (``S_e -= sk(Δ)``; the buckets of the chosen coordinates of ``S_u`` are
    zeroed). The decoded "mean delta" is already lr-scaled (use server SGD with lr 1)."""

    name = "fetchsgd"

    def __init__(self, size: int | None = None, ratio: float | None = None, rows: int = 5,
                 k: int | None = None, k_ratio: float | None = None, momentum: float = 0.9,
                 lr=1.0, seed: int = 0) -> None:
        self.sk = SketchCodec("count", size, ratio, seed, rows)
        self.k, self.k_ratio, self.rho, self.lr = k, k_ratio, float(momentum), lr

    def server_init(self, params):
        shape = self.sk.op(numel(params)).shape
        z = zeros_flat(params)
        return {"u": z.new_zeros(shape), "e": z.new_zeros(shape)}

    def encode(self, delta, state, ctx):
        v = flatten(delta)
        return {"y": self.sk.op(v.numel()).sketch(v, 0)}, state

    def decode(self, mean_message, state, params, round_):
        from fedforge.core.schedules import as_schedule  # noqa: PLC0415
        op: CountSketch = self.sk.op(numel(params))  # type: ignore[assignment]
        d, y = numel(params), mean_message["y"]
        lr = as_schedule(self.lr, "server_lr").at(round_)
        u = self.rho * state["u"].to(y.device) + y
        e = state["e"].to(y.device) + lr * u
        est = op.desketch(e, 0, mode="median")
        if self.k is None and self.k_ratio is None:  # default: a tenth of the columns
            k = max(1, min(d, op.cols // 10))
        else:
            k = C.count_k(d, self.k, self.k_ratio if self.k is None else None)
        delta = C.topk(est, k)
        e = e - op.sketch(delta, 0)
        hit = op.sketch((delta != 0).to(y.dtype), 0) != 0  # buckets touched by Δ's support
        u = torch.where(hit, torch.zeros_like(u), u)
        return unflatten(delta, params), {"u": u, "e": e}

    def nbytes(self, params, round_=None):
        return 4 * self.sk.op(numel(params)).numel
