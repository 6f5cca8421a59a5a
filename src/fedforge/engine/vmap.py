"""VmapEngine: a chunk of the cohort as one batched computation (``torch.func.vmap``)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from fedforge.core.memory import available_memory
from fedforge.core.tree import tree_nbytes
from fedforge.engine.activations import ActivationSizes
from fedforge.engine.base import ChunkedEngine, CohortInputs
from fedforge.engine.batched_conv import STRATEGIES, BatchedConvMode, ConvPlans
from fedforge.engine.randomness import vmap_refusal
from fedforge.engine.stages import LossFn

CONV_MODES = ("native", "auto", *STRATEGIES)


ACTIVATION_ALLOWANCE = 64  # input samples' bytes per sample: activations when not measured
# a vmapped step's memory per client over the bytes autograd saves for it (the backward's
# gradients of activations, vmap's batched copies): MiniLM with LoRA, 16 x 64 tokens, fp32,
# 146 MiB saved, 411 MiB more peak memory per client from a chunk of 1 to one of 4 (2026-12-02)
ACTIVATION_FACTOR = 3.0


def _free_memory_bytes(device: torch.device) -> int:
    """Free memory of the device (:func:`~fedforge.core.memory.available_memory`: on a CPU the
    kernel's ``MemAvailable`` or a container's memory limit, whichever is lower)."""
    free = available_memory(device)
    return free if free is not None else 4 * 2**30


def refusing_random(fn: Callable, engine: str) -> Callable:
    """``fn`` (a vmapped function), with vmap's multi-line error for a random operation
    raised as one line naming ``engine`` (:mod:`fedforge.engine.randomness`)."""

    def call(*args):
        try:
            return fn(*args)
        except RuntimeError as exc:
            refusal = vmap_refusal(exc, engine)
            if refusal is None:
                raise
            raise refusal from None

    return call


class VmapEngine(ChunkedEngine):
    """Vectorised engine; ``chunk_size="auto"`` sizes chunks from free device memory.

    The estimate per client is the stacked model-sized tensors a local round keeps live
    (params, grads, optimizer moments, deltas and the select copies: ``state_factor`` copies
    of the model) plus the gathered mini-batches and one step's activations: the bytes
    autograd saves for one client's step, measured once per (model, batch shape, dtype,
    precision) on the first client's first batch outside vmap
    (:mod:`fedforge.engine.activations`; a pretrained text model's activations are hundreds
    of times its token ids), times ``activation_factor`` (3: the backward's and vmap's
    temporaries on top, measured on MiniLM). The chunk is ``memory_fraction`` of the free memory
    (``MemAvailable`` on a CPU) over that estimate, between 1 and the cohort. On CPU the
    chunk is also capped so that the chunk's stacked models fit ``cpu_model_budget`` bytes
    (32 MiB: ``budget // model bytes`` clients, or ``cpu_max_chunk`` if given): small models
    gain from wide vmaps (W1 shapes on 2 cores, cohort 100: logreg 713 updates/s at chunk 8,
    2096 at 100; MLP 240 at 8, 291 at 32, 208 at 100), while a conv net already saturates
    the cores with one client's batch and wide vmaps only add memory traffic (CNN, 6.6 MB:
    flat from chunk 1 to 8, half at 64; benchmarks/history/2026-11.md).

    ``compile=True`` (opt-in, meant for GPUs; or a ``torch.compile`` mode name:
    ``"reduce-overhead"`` also captures the fixed-shape chunk in CUDA graphs on a GPU, which is
    why auto chunks are balanced) passes each vmapped chunk function through
    ``torch.compile``: the whole local round (every step unrolled) becomes one graph per
    (algorithm, loss, masked) function. The first call of each compiles (minutes on a small
    CPU); ``"auto"`` chunks are then balanced (cohort 10: 5+5, not 8+2) and a ragged last
    chunk recompiles once with a dynamic client axis. Results equal the eager engine to float
    tolerance (tests/engine/test_compile.py). All compiled chunk functions of a process share
    dynamo's recompile limit (8 by default), past which dynamo falls back to eager with a
    warning. Compiled graphs are stored in torch's on-disk caches (FX graph, AOTAutograd) in
    ``$TORCHINDUCTOR_CACHE_DIR``, by default ``~/.cache/fedforge/inductor``
    (:mod:`fedforge.engine.compile_cache`), so a later process skips most of the compiling.
    W1 on a 2-core CPU (benchmarks/history/2026-11.md): 1.2x eager vmap but still below the
    plain loop in fp32; with bf16 1.2x the plain bf16 loop, after 75-160 s of compiling.

    ``conv`` chooses how convolutions and max-pooling of the vmapped clients run:
    ``"native"`` (functorch's batching rules), or through
    :class:`~fedforge.engine.batched_conv.BatchedConvMode` with one strategy for every layer
    (``"grouped"``, ``"loop"``, ``"bmm"``) or ``"auto"``, the fastest per layer shape by a
    one-off micro-benchmark. The per-shape choices (and the measured activation bytes) are
    part of :meth:`state_dict`, so a resumed run computes and chunks as the interrupted one.
    Not combined with ``compile``.
    """

    name = "vmap"

    def __init__(
        self,
        chunk_size: int | str = "auto",
        *,
        memory_fraction: float = 0.5,
        state_factor: int = 10,
        cpu_model_budget: int = 32 * 2**20,
        cpu_max_chunk: int | None = None,
        activation_factor: float = ACTIVATION_FACTOR,
        keep_deltas: bool = False,
        compile: bool | str = False,
        conv: str = "native",
    ) -> None:
        super().__init__(keep_deltas=keep_deltas)
        if chunk_size != "auto" and (not isinstance(chunk_size, int) or chunk_size < 1):
            raise ValueError(
                f"engine.chunk_size: expected 'auto' or an int >= 1, got {chunk_size!r}"
            )
        self._chunk = chunk_size
        self.memory_fraction = memory_fraction
        self.state_factor = state_factor
        self.cpu_model_budget = cpu_model_budget
        self.cpu_max_chunk = cpu_max_chunk
        self.activation_factor = activation_factor
        self.compile = compile
        if conv not in CONV_MODES:
            raise ValueError(f"engine.conv: expected one of {CONV_MODES}, got {conv!r}")
        self.conv = conv
        self.plans = ConvPlans(conv) if conv != "native" else None
        self.activations = ActivationSizes()

    def chunk_size(self, inputs: CohortInputs, x_all: torch.Tensor,
                   y_all: torch.Tensor | None = None, loss_fn: LossFn | None = None) -> int:
        """Clients per vmapped call: as many as :meth:`client_bytes` lets fit in
        ``memory_fraction`` of the free memory (and on a CPU the model cap), 1 to the cohort."""
        if self._chunk != "auto":
            return int(self._chunk)
        num_clients = inputs.sample_idx.shape[0]
        budget = self.memory_fraction * _free_memory_bytes(x_all.device)
        per_client = self.client_bytes(inputs, x_all, y_all, loss_fn)
        chunk = min(int(budget // max(per_client, 1)), max(num_clients, 1))
        if x_all.device.type != "cuda":
            cap = self.cpu_max_chunk or self.cpu_model_budget // max(
                tree_nbytes(inputs.global_params), 1)
            chunk = min(chunk, int(cap))
        chunk = max(1, chunk)
        if self.compile:  # equal chunks where possible: each new chunk shape recompiles
            chunk = -(-num_clients // -(-num_clients // chunk)) if num_clients else chunk
        return chunk

    def client_bytes(self, inputs: CohortInputs, x_all: torch.Tensor,
                     y_all: torch.Tensor | None = None, loss_fn: LossFn | None = None) -> int:
        """One client's memory in a vmapped chunk: ``state_factor`` copies of the model, its
        gathered mini-batches and one step's activations: ``activation_factor`` times the
        bytes saved on the first client's first batch (:mod:`fedforge.engine.activations`)
        when the loss is given, else :data:`ACTIVATION_ALLOWANCE` input samples per sample."""
        _, steps, batch = inputs.sample_idx.shape
        sample_bytes = x_all[:1].numel() * x_all.element_size()
        if loss_fn is not None and y_all is not None and inputs.sample_idx.numel():
            idx = inputs.sample_idx[0, 0]
            activations = self.activation_factor * self.activations.measure(
                loss_fn, inputs.global_params, x_all[idx], y_all[idx], inputs.weights[0, 0])
        else:
            activations = ACTIVATION_ALLOWANCE * batch * sample_bytes
        return int(self.state_factor * tree_nbytes(inputs.global_params)
                   + steps * batch * sample_bytes + activations)

    def wrap(self, fn: Callable) -> Callable:
        # global params and broadcast are shared; everything per-client has a leading axis
        chunk_fn = refusing_random(torch.func.vmap(fn, in_dims=(None, None, 0, 0, 0, 0, 0)),
                                   self.label or self.name)
        if self.plans is not None and not self.compile:
            plans = self.plans

            def batched_conv_chunk(*args):
                with BatchedConvMode(plans):
                    return chunk_fn(*args)

            return batched_conv_chunk
        if not self.compile:
            return chunk_fn
        from fedforge.engine.compile_cache import use_compile_cache

        use_compile_cache()  # compiled graphs are reused by later processes
        mode = "default" if self.compile is True else str(self.compile)
        return torch.compile(chunk_fn, mode=mode)

    def state_dict(self) -> dict:
        """The per-shape choices made so far: the convolution strategies (none for
        ``conv="native"``) and the measured activation bytes (none before a cohort ran)."""
        state = {"conv_plans": self.plans.state_dict()} if self.plans is not None else {}
        if self.activations.bytes:
            state["activation_bytes"] = self.activations.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        if self.plans is not None:
            self.plans.load_state_dict(state.get("conv_plans", {}))
        self.activations.load_state_dict(state.get("activation_bytes", {}))
