"""Convolution and max-pooling for vmapped clients, without functorch's slow batching rules.

Under ``torch.func.vmap`` over stacked client weights, functorch turns a convolution into
one grouped convolution (client axis folded into the channels) whose CPU backward is slower
than the clients' convolutions run one by one, and its max-pool rule copies the input to a
new layout. :class:`BatchedConvMode` is a ``TorchFunctionMode`` the vmapped engine enters
around a chunk: it routes ``F.conv2d`` to a ``torch.func``-compatible autograd function
whose batching rule picks, per layer shape, the fastest of

* ``grouped``: one grouped convolution over all clients (what functorch does);
* ``loop``: the clients' own convolutions one after another (no layout change);
* ``bmm``: unfold (im2col) + one batched GEMM over the client axis (``torch.baddbmm``);

and ``F.max_pool2d`` with ``kernel == stride`` (no padding) to maxima of strided views
(:mod:`fedforge.engine.pooling`), which stay in the input's layout. The forward and the
backward convolution choices are made separately by a one-off micro-benchmark on the
layer's shapes, cached per (shape, dtype, threads) in
:class:`ConvPlans` (the engine checkpoints them so a resumed run computes the same way).

Every strategy equals ``F.conv2d`` to float tolerance (``tests/engine/test_batched_conv.py``);
the pooling equals ``F.max_pool2d`` bit for bit, ties included.

Under bf16 autocast the convolutions and GEMMs run in bf16 (the weights are cast once per
layer call, as autocast does); gradients of fp32 weights come back in fp32.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from fedforge.engine.pooling import POOL_FUNCS, as_pair, max_pool2d_tiled

STRATEGIES = ("grouped", "loop", "bmm")


class ConvPlans:
    """Per-shape choice of strategy (``auto``), or one forced strategy for every layer."""

    def __init__(self, strategy: str = "auto", repeats: int = 3) -> None:
        if strategy != "auto" and strategy not in STRATEGIES:
            raise ValueError(f"engine conv strategy: expected 'auto' or one of {STRATEGIES}, "
                             f"got {strategy!r}")
        self.strategy = strategy
        self.repeats = repeats
        self.plans: dict[str, str] = {}  # key -> strategy
        self.timings: dict[str, dict[str, float]] = {}  # key -> {strategy: seconds}

    def pick(self, key: str, candidates: dict[str, Callable[[], object]]) -> str:
        """The strategy for ``key``: forced, cached, or the fastest candidate measured now."""
        if self.strategy != "auto":
            return self.strategy if self.strategy in candidates else "loop"
        if key not in self.plans:
            times = {name: _best_time(fn, self.repeats) for name, fn in candidates.items()}
            self.timings[key] = times
            self.plans[key] = min(times, key=times.__getitem__)
        return self.plans[key]

    def state_dict(self) -> dict[str, str]:
        return dict(self.plans)

    def load_state_dict(self, plans: dict[str, str]) -> None:
        bad = [v for v in plans.values() if v not in STRATEGIES]
        if bad:
            raise ValueError(f"engine conv plans: unknown strategy {bad[0]!r}")
        self.plans.update(plans)


def _best_time(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: allocations, oneDNN primitive creation
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


class _Spec:
    """Stride, padding, dilation and groups of one convolution (hashable key part)."""

    def __init__(self, stride, padding, dilation, groups) -> None:
        self.stride, self.padding = as_pair(stride), as_pair(padding)
        self.dilation, self.groups = as_pair(dilation), int(groups)

    def key(self) -> str:
        return f"s{self.stride}p{self.padding}d{self.dilation}g{self.groups}"


# --- the strategies, on physical tensors with the client axis first -------------------------
# x [C, N, Ci, H, W], w [C, O, Ci/g, kh, kw], b [C, O] | None; go [C, N, O, oh, ow]


def _grouped_fwd(x, w, b, sp: _Spec):
    c, n = x.shape[:2]
    xg = x.transpose(0, 1).reshape(n, -1, *x.shape[3:])
    out = F.conv2d(xg, w.reshape(-1, *w.shape[2:]), None if b is None else b.reshape(-1),
                   sp.stride, sp.padding, sp.dilation, sp.groups * c)
    return out.view(n, c, -1, *out.shape[2:]), 1


def _loop_fwd(x, w, b, sp: _Spec):
    outs = [F.conv2d(x[i], w[i], None if b is None else b[i], sp.stride, sp.padding,
                     sp.dilation, sp.groups) for i in range(x.shape[0])]
    return torch.stack(outs), 0


def _out_hw(x, w, sp: _Spec) -> tuple[int, int]:
    return tuple(  # type: ignore[return-value]
        (x.shape[3 + i] + 2 * sp.padding[i] - sp.dilation[i] * (w.shape[3 + i] - 1) - 1)
        // sp.stride[i] + 1 for i in range(2))


def _cols(x, w, sp: _Spec):
    """im2col of every client's batch: [C, Ci*kh*kw, N*L]."""
    c, n = x.shape[:2]
    cols = F.unfold(x.reshape(c * n, *x.shape[2:]), w.shape[3:], sp.dilation, sp.padding,
                    sp.stride)  # [C*N, J, L]
    return cols.view(c, n, *cols.shape[1:]).transpose(1, 2).reshape(c, cols.shape[1], -1)


def _bmm_fwd(x, w, b, sp: _Spec):
    c, n = x.shape[:2]
    oh, ow = _out_hw(x, w, sp)
    cols = _cols(x, w, sp)
    wm = w.reshape(c, w.shape[1], -1)
    out = (torch.bmm(wm, cols) if b is None
           else torch.baddbmm(b.unsqueeze(-1), wm, cols))  # [C, O, N*L]
    return out.view(c, -1, n, oh, ow).transpose(1, 2), 0


def _grouped_bwd(go, x, w, sp: _Spec, need_x: bool):
    c, n = x.shape[:2]
    gx, gw, _ = torch.ops.aten.convolution_backward(
        go.transpose(0, 1).reshape(n, -1, *go.shape[3:]),
        x.transpose(0, 1).reshape(n, -1, *x.shape[3:]), w.reshape(-1, *w.shape[2:]), None,
        list(sp.stride), list(sp.padding), list(sp.dilation), False, [0, 0],
        sp.groups * c, [need_x, True, False])
    gw = gw.view(w.shape)
    return ((gx.view(n, c, *x.shape[2:]), gw), (1, 0)) if need_x else (gw, 0)


def _loop_bwd(go, x, w, sp: _Spec, need_x: bool):
    res = [torch.ops.aten.convolution_backward(
        go[i], x[i], w[i], None, list(sp.stride), list(sp.padding), list(sp.dilation), False,
        [0, 0], sp.groups, [need_x, True, False]) for i in range(x.shape[0])]
    gw = torch.stack([r[1] for r in res])
    return ((torch.stack([r[0] for r in res]), gw), (0, 0)) if need_x else (gw, 0)


def _bmm_bwd(go, x, w, sp: _Spec, need_x: bool):
    c, n = x.shape[:2]
    gom = go.transpose(1, 2).reshape(c, go.shape[2], -1)  # [C, O, N*L]
    gw = torch.bmm(gom, _cols(x, w, sp).transpose(1, 2)).view(w.shape)
    if not need_x:
        return gw, 0
    gcols = torch.bmm(w.reshape(c, w.shape[1], -1).transpose(1, 2), gom)  # [C, J, N*L]
    j = gcols.shape[1]
    gcols = gcols.view(c, j, n, -1).transpose(1, 2).reshape(c * n, j, -1)
    gx = F.fold(gcols, x.shape[3:], w.shape[3:], sp.dilation, sp.padding, sp.stride)
    return (gx.view(x.shape), gw), (0, 0)


_FWD = {"grouped": _grouped_fwd, "loop": _loop_fwd, "bmm": _bmm_fwd}
_BWD = {"grouped": _grouped_bwd, "loop": _loop_bwd, "bmm": _bmm_bwd}


def _front(t, dim, size):
    return t.movedim(dim, 0) if dim is not None else t.expand(size, *t.shape)


def _shape_key(kind: str, x, w, sp: _Spec, extra: str = "") -> str:
    return (f"{kind}:x{list(x.shape)}:w{list(w.shape)}:{sp.key()}:{x.dtype}:{extra}"
            f"t{torch.get_num_threads()}").replace(" ", "")


def _candidates(table: dict, sp: _Spec, args: tuple) -> dict[str, Callable[[], object]]:
    names = [s for s in STRATEGIES if s != "bmm" or sp.groups == 1]
    return {s: (lambda s=s: table[s](*args)) for s in names}


def _randn_like(t):
    return torch.randn(t.shape, dtype=t.dtype, device=t.device)


class _Conv2d(torch.autograd.Function):
    @staticmethod
    def forward(x, w, b, sp, plans):
        return F.conv2d(x, w, b, sp.stride, sp.padding, sp.dilation, sp.groups)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, w, b, sp, plans = inputs
        ctx.save_for_backward(x, w)
        ctx.sp, ctx.plans = sp, plans

    @staticmethod
    def backward(ctx, go):
        x, w = ctx.saved_tensors
        need_x, _, need_b = ctx.needs_input_grad[:3]
        if need_x:
            gx, gw = _ConvBackward.apply(go, x, w, ctx.sp, ctx.plans, True)
        else:
            gx, gw = None, _ConvBackward.apply(go, x, w, ctx.sp, ctx.plans, False)
        gb = go.sum((0, 2, 3), dtype=w.dtype) if need_b else None
        return gx, gw, gb, None, None

    @staticmethod
    def vmap(info, in_dims, x, w, b, sp, plans):
        size = info.batch_size
        x, w = _front(x, in_dims[0], size), _front(w, in_dims[1], size)
        b = None if b is None else _front(b, in_dims[2], size)
        args = (x, w, b, sp)
        key = _shape_key("fwd", x, w, sp, f"b{b is not None}:ac{_autocast(x)}:")
        bench = (_randn_like(x), _randn_like(w), None if b is None else _randn_like(b), sp)
        strategy = plans.pick(key, _candidates(_FWD, sp, bench))
        return _FWD[strategy](*args)


class _ConvBackward(torch.autograd.Function):
    """Input and weight gradients of a convolution (no double backward)."""

    @staticmethod
    def forward(go, x, w, sp, plans, need_x):
        dt = go.dtype
        gx, gw, _ = torch.ops.aten.convolution_backward(
            go, x.to(dt), w.to(dt), None, list(sp.stride), list(sp.padding),
            list(sp.dilation), False, [0, 0], sp.groups, [need_x, True, False])
        return (gx.to(x.dtype), gw.to(w.dtype)) if need_x else gw.to(w.dtype)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, *grads):  # pragma: no cover - second derivatives are not supported
        raise RuntimeError("batched convolution: double backward is not supported")

    @staticmethod
    def vmap(info, in_dims, go, x, w, sp, plans, need_x):
        size = info.batch_size
        go, x, w = (_front(t, d, size) for t, d in zip((go, x, w), in_dims[:3]))
        xdt, wdt = x.dtype, w.dtype
        x, w = x.to(go.dtype), w.to(go.dtype)  # bf16 autocast: compute in go's dtype
        key = _shape_key("bwd", x, w, sp, f"gx{need_x}:")
        bench = (_randn_like(go), _randn_like(x), _randn_like(w), sp, need_x)
        strategy = plans.pick(key, _candidates(_BWD, sp, bench))
        out, dims = _BWD[strategy](go, x, w, sp, need_x)
        if need_x:
            return (out[0].to(xdt), out[1].to(wdt)), dims
        return out.to(wdt), dims


def _autocast(x) -> bool:
    return torch.is_autocast_enabled(x.device.type) and x.is_floating_point()


def conv2d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1, *,
           plans: ConvPlans | None = None):
    """``F.conv2d`` whose batching rule is the per-shape fastest strategy of ``plans``."""
    if isinstance(padding, str):  # 'same' / 'valid': leave it to torch
        return F.conv2d(x, w, b, stride, padding, dilation, groups)
    return _Conv2d.apply(x, w, b, _Spec(stride, padding, dilation, groups),
                         plans or ConvPlans())


class BatchedConvMode(TorchFunctionMode):
    """Inside this mode ``F.conv2d`` and tiling ``F.max_pool2d`` use the batched kernels.

    Enter it around a vmapped chunk function; outside vmap the functions compute exactly
    what torch's do (the batching rules only run for batched inputs)."""

    def __init__(self, plans: ConvPlans | None = None) -> None:
        super().__init__()
        self.plans = plans or ConvPlans()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.conv2d:
            return conv2d(*args, **kwargs, plans=self.plans)
        if func in POOL_FUNCS:
            return max_pool2d_tiled(*args, **kwargs)
        return func(*args, **kwargs)
