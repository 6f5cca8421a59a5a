"""Simulated wall-clock cost of a synchronous round: compute plus link time, for any algorithm.

The paper behind FAdamGC (Chen et al., Table 2) reports "simulated run time" with client
gradients computed on an NVIDIA A100 and 100 Mbps client-server links. This module is that
model, kept general:

* a local step costs ``step_time_s`` seconds, given directly or derived as
  ``train_flops_per_sample * batch_size / device_flops`` (:func:`step_seconds`);
* a message of ``b`` bytes over a link of ``B`` Mbit/s takes ``latency_s + 8 b / (B 1e6)`` s;
* client ``i`` takes ``download + steps_i * step_time / speed_i + upload`` (:meth:`CostModel.
  client_seconds`, the per-client hook the event-driven simulator can call);
* a synchronous round lasts as long as its slowest sampled client (:meth:`CostModel.
  round_seconds`).

Bytes come from :meth:`fedforge.protocol.algorithm.Algorithm.message_nbytes`, i.e. what the
algorithm really sends (FAdamGC: ``x`` and ``y`` down; the delta plus, on average over the
cohort, ``S̃/S`` tracking deltas up). Using the cohort-average upload for every client is
what reproduces the paper's per-round costs (3.5 model transfers for FAdamGC, 2 for LocalAdam);
pass per-client byte arrays to :meth:`CostModel.round_seconds` for the exact max instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

# Peak dense throughput (FLOP/s) of common accelerators, used to turn model FLOPs into seconds.
# fp32 figures without tensor cores (the conservative reading of "computed on an A100"); the
# TF32/bf16 tensor-core figures are listed separately. Simulated compute is therefore a lower
# bound on a real step (no kernel-launch or data-loading overhead).
DEVICE_FLOPS: dict[str, float] = {
    "a100": 19.5e12,        # NVIDIA A100, fp32 (CUDA cores)
    "a100_tf32": 156e12,    # NVIDIA A100, TF32 tensor cores
    "a100_bf16": 312e12,    # NVIDIA A100, bf16 tensor cores
    "h100": 67e12,          # NVIDIA H100 SXM, fp32
    "v100": 15.7e12,        # NVIDIA V100 SXM2, fp32
    "t4": 8.1e12,           # NVIDIA T4, fp32
    "cpu": 1e11,            # a few modern CPU cores, fp32 (order of magnitude)
}

TRAIN_FLOPS_PER_FORWARD = 3.0  # forward + backward ≈ 3 x forward (backward = 2 x forward)


def device_flops(device: str) -> float:
    """FLOP/s of a preset in :data:`DEVICE_FLOPS` (error names ``sim.device``)."""
    try:
        return DEVICE_FLOPS[device]
    except KeyError:
        raise ValueError(f"sim.device: unknown device {device!r}; known: "
                         f"{', '.join(sorted(DEVICE_FLOPS))}") from None


def step_seconds(train_flops_per_sample: float, batch_size: int, flops_per_second: float) -> float:
    """Seconds of one local step: ``flops/sample x batch / throughput``."""
    if train_flops_per_sample < 0 or batch_size < 1 or flops_per_second <= 0:
        raise ValueError("step_seconds: need flops >= 0, batch_size >= 1, throughput > 0")
    return train_flops_per_sample * batch_size / flops_per_second


def model_train_flops(model: torch.nn.Module, input_shape: Sequence[int]) -> float:
    """Training FLOPs per sample: 3 x the forward multiply-adds (x2) of the model's linear and
    convolution layers, counted with forward hooks on one zero sample. Norms, activations and
    pooling are ignored (they are a few percent of a CNN's FLOPs); so are an LSTM's gates and
    attention's fused in-projection, so the count is a lower bound for recurrent and
    transformer models — set ``sim.step_time_s`` for those when it matters."""
    total = [0.0]

    def hook(mod: torch.nn.Module, _inp, out: torch.Tensor) -> None:
        if isinstance(mod, torch.nn.Linear):
            total[0] += 2.0 * out.numel() * mod.in_features
        else:  # _ConvNd: each output element is a dot product over (C_in/groups) x kernel
            k = math.prod(mod.kernel_size) * mod.in_channels // mod.groups
            total[0] += 2.0 * out.numel() * k

    kinds = (torch.nn.Linear, torch.nn.modules.conv._ConvNd)
    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, kinds)]
    param = next(iter(model.parameters()), None)
    # token models (an Embedding anywhere) take integer ids, everything else floats
    tokens = any(isinstance(m, torch.nn.Embedding) for m in model.modules())
    dtype = torch.long if tokens else getattr(param, "dtype", torch.get_default_dtype())
    x = torch.zeros(1, *input_shape, dtype=dtype,
                    device=param.device if param is not None else "cpu")
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    return TRAIN_FLOPS_PER_FORWARD * total[0]


def transfer_seconds(nbytes: float, mbps: float, latency_s: float = 0.0) -> float:
    """Seconds to move ``nbytes`` over a ``mbps`` Mbit/s link after ``latency_s``."""
    return latency_s + 8.0 * nbytes / (mbps * 1e6)


@dataclass(frozen=True)
class CostModel:
    """Per-step compute seconds and link speeds; see the module docstring for the formulas."""

    step_time_s: float
    bandwidth_up_mbps: float = 100.0
    bandwidth_down_mbps: float = 100.0
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("bandwidth_up_mbps", "bandwidth_down_mbps"):
            if not getattr(self, name) > 0:
                raise ValueError(f"sim.{name}: expected > 0, got {getattr(self, name)}")
        if not self.step_time_s >= 0:
            raise ValueError(f"sim.step_time_s: expected >= 0, got {self.step_time_s}")
        if not self.latency_s >= 0:
            raise ValueError(f"sim.latency_s: expected >= 0, got {self.latency_s}")

    def client_seconds(self, steps: float, down_bytes: float, up_bytes: float,
                       speed: float = 1.0) -> float:
        """One client's round trip: download, ``steps`` local steps at ``speed`` x, upload."""
        return (transfer_seconds(down_bytes, self.bandwidth_down_mbps, self.latency_s)
                + steps * self.step_time_s / speed
                + transfer_seconds(up_bytes, self.bandwidth_up_mbps, self.latency_s))

    def round_seconds(self, steps, down_bytes, up_bytes, speed=1.0) -> float:
        """Synchronous round: the slowest sampled client. Arguments broadcast (scalars or
        per-client arrays); an empty cohort costs 0."""
        s = np.asarray(steps, dtype=np.float64)
        if s.size == 0:
            return 0.0
        down = transfer_seconds(np.asarray(down_bytes, np.float64), self.bandwidth_down_mbps,
                                self.latency_s)
        up = transfer_seconds(np.asarray(up_bytes, np.float64), self.bandwidth_up_mbps,
                              self.latency_s)
        return float(np.max(down + s * self.step_time_s / np.asarray(speed, np.float64) + up))


def build_cost_model(sim, model: torch.nn.Module | None = None,
                     input_shape: Sequence[int] | None = None,
                     batch_size: int | None = None) -> CostModel:
    """A :class:`CostModel` from a ``sim`` config section: ``sim.step_time_s`` if set, else
    the model's training FLOPs x ``batch_size`` / the ``sim.device`` (or ``sim.device_flops``)
    throughput."""
    step = sim.step_time_s
    if step is None:
        if model is None or input_shape is None or batch_size is None:
            raise ValueError("sim.step_time_s: not set, and no model to count FLOPs of")
        flops = sim.device_flops if sim.device_flops is not None else device_flops(sim.device)
        step = step_seconds(model_train_flops(model, input_shape), batch_size, flops)
    return CostModel(step, sim.bandwidth_up_mbps, sim.bandwidth_down_mbps, sim.latency_s)
