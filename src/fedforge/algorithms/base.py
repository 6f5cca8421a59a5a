"""What an algorithm is: a local optimizer, stateful parts, and a server optimizer.

An :class:`Algorithm` never loops over rounds, clients or batches (the engine and runner do).
It composes

* ``local_optimizer`` — a :class:`~fedforge.client.transforms.Transform` run for every local
  step on the raw mini-batch gradient;
* ``parts`` — stateful add-ons (SCAFFOLD control variates, FAdamGC tracking, ...) that own
  per-client state, server state, what is broadcast, and what is uploaded;
* ``server_optimizer`` — applied to the aggregated pseudo-gradient ``Δ = x - mean_i x_i``.

The client's ``delta`` is always ``x^t - x_i`` (server minus client), defined once in
:func:`fedforge.engine.local.make_local_update`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from fedforge.client.transforms import RoundContext, Transform
from fedforge.comm.codec import Codec
from fedforge.core.tree import Params, tree_add, tree_nbytes
from fedforge.server.optimizers import ServerOptimizer


class FinalizeInputs(NamedTuple):
    """Everything a part may use when a client's local round ends."""

    ctx: RoundContext
    delta: Params  # x^t - x_i^{t,K}
    params: Params  # x_i^{t,K}
    opt_state: dict  # final local optimizer state, keyed by transform name
    grad_sum: Params | None  # sum of raw mini-batch gradients over the steps taken
    num_steps: torch.Tensor  # steps actually taken (0-d)


class PrepareInputs(NamedTuple):
    """What a part's pre-training client hook sees (outside the vmapped local round)."""

    global_params: Params  # x^t, as broadcast
    broadcast: dict  # algorithm.broadcast(server_state) + "round"
    client_states: dict  # the cohort's persistent states, stacked [C, ...], by part name
    info: dict  # per-client round inputs [C] (from round_info)
    loss_fn: Callable  # loss_fn(params, x, y, w) of the run's model
    x_all: torch.Tensor  # [N, ...] the whole training set
    y_all: torch.Tensor  # [N]
    sample_idx: torch.Tensor  # [C, steps, batch] this round's local samples (into x_all)
    weights: torch.Tensor  # [C, steps, batch], 0 = padding


class Part:
    """A stateful add-on; subclasses override what they need. Default: stateless."""

    name: str = "part"

    def client_init(self, params: Params) -> dict:
        """Per-client persistent state, for one client (the store stacks it)."""
        return {}

    def server_init(self, params: Params) -> dict:
        return {}

    def broadcast(self, server_state: dict) -> dict:
        """Tensors sent to every sampled client besides the model."""
        return {}

    def finalize(self, fin: FinalizeInputs) -> tuple[dict, dict]:
        """-> (this client's new persistent state, uploads to be averaged over the cohort)."""
        return fin.ctx.client_state.get(self.name, {}), {}

    def server_update(
        self, server_state: dict, mean_uploads: dict, num_sampled: int, num_clients: int
    ) -> dict:
        return server_state

    def round_info(self, num_sampled: int, generator: torch.Generator) -> dict:
        """Per-client round inputs (e.g. which sampled clients track), tensors of [num_sampled]."""
        return {}

    needs_grad_sum: bool = False

    # --- optional hooks for parts that do non-vmappable work around the local round ----
    prepares: bool = False  # True: prepare_cohort / server_prepare are called (FedPTR)

    def bind_data(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        """Told the dataset's sample shape and class count before any state is built."""

    def prepare_cohort(self, prep: PrepareInputs) -> tuple[dict, dict, dict]:
        """Before local training, per cohort, eagerly (not vmapped, same for every engine).

        -> (this part's new stacked client states, extra per-client info [C, ...] merged into
        the round's info, metrics such as ``{"distill_s": [C]}``).
        """
        return prep.client_states.get(self.name, {}), {}, {}

    def server_prepare(
        self, server_state: dict, params: Params, loss_fn: Callable
    ) -> tuple[dict, dict]:
        """At the start of a round, on the server, seeing the current global model x^t.

        -> (this part's new server state, metrics such as ``{"server_distill_s": 0-d}``).
        """
        return server_state, {}

    def adjust_params(self, params: Params, server_state: dict) -> Params:
        """After the server step: a correction of the new global model (FedDyn's -h/α)."""
        return params


@dataclass(frozen=True)
class Algorithm:
    name: str
    local_optimizer: Transform
    server_optimizer: ServerOptimizer
    parts: tuple[Part, ...] = ()
    description: str = ""
    hparams: dict = field(default_factory=dict)
    codec: Codec | None = None  # uplink codec (fedforge.comm.codec): encode/average/decode

    @property
    def needs_grad_sum(self) -> bool:
        return any(p.needs_grad_sum for p in self.parts)

    # --- client side -----------------------------------------------------------------
    def client_init(self, params: Params) -> dict:
        states = {p.name: p.client_init(params) for p in self.parts}
        if self.codec is not None:  # EF residual / MARINA's last delta, in the client store
            states["codec"] = self.codec.client_init(params)
        return {name: state for name, state in states.items() if state}

    def finalize(self, fin: FinalizeInputs) -> tuple[dict, dict]:
        states, uploads = {}, {}
        for p in self.parts:
            state, up = p.finalize(fin)
            if p.name in fin.ctx.client_state:
                states[p.name] = state
            if up:
                uploads[p.name] = up
        return states, uploads

    def round_info(self, num_sampled: int, generator: torch.Generator) -> dict:
        info: dict = {}
        for p in self.parts:
            info.update(p.round_info(num_sampled, generator))
        if self.codec is not None:
            info.update(self.codec.round_info(num_sampled, generator))
        return info

    def bind_data(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        """Tell every part the data's sample shape and class count (the runner calls this)."""
        for p in self.parts:
            p.bind_data(tuple(input_shape), num_classes)

    def prepare_cohort(self, prep: PrepareInputs) -> tuple[dict, dict, dict]:
        """-> (client states, info, metrics) after every preparing part's client hook."""
        states, info, metrics = dict(prep.client_states), dict(prep.info), {}
        for p in self.parts:
            if not p.prepares:
                continue
            state, extra, m = p.prepare_cohort(prep._replace(client_states=states, info=info))
            if p.name in states:
                states[p.name] = state
            info.update(extra)
            metrics.update(m)
        return states, info, metrics

    def server_prepare(
        self, params: Params, server_state: dict, loss_fn: Callable
    ) -> tuple[dict, dict]:
        """-> (server state, metrics) after every preparing part's server hook."""
        parts, metrics = dict(server_state["parts"]), {}
        for p in self.parts:
            if p.prepares:
                parts[p.name], m = p.server_prepare(parts[p.name], params, loss_fn)
                metrics.update(m)
        return {**server_state, "parts": parts}, metrics

    @property
    def prepares(self) -> bool:
        return any(p.prepares for p in self.parts)

    # --- server side -----------------------------------------------------------------
    def server_init(self, params: Params) -> dict:
        state = {
            "opt": self.server_optimizer.init(params),
            "parts": {p.name: p.server_init(params) for p in self.parts},
        }
        if self.codec is not None:
            state["codec"] = self.codec.server_init(params)
        return state

    def decode_uplink(
        self, mean_message: dict, server_state: dict, params: Params, round_: int
    ) -> tuple[Params, dict]:
        """The codec's server side: mean message -> mean delta (before the server step)."""
        if self.codec is None:
            return mean_message, server_state
        delta, codec_state = self.codec.decode(
            mean_message, server_state.get("codec", {}), params, round_)
        return delta, {**server_state, "codec": codec_state}

    def broadcast(self, server_state: dict) -> dict:
        return {p.name: p.broadcast(server_state["parts"][p.name]) for p in self.parts}

    def server_step(
        self,
        params: Params,
        server_state: dict,
        mean_delta: Params,
        mean_uploads: dict,
        num_sampled: int,
        num_clients: int,
    ) -> tuple[Params, dict]:
        """Apply the server optimizer to ``mean_delta`` and update every part's server state."""
        updates, opt_state = self.server_optimizer.update(mean_delta, server_state["opt"], params)
        new_params = tree_add(params, updates)
        parts = {
            p.name: p.server_update(
                server_state["parts"][p.name], mean_uploads.get(p.name, {}), num_sampled,
                num_clients,
            )
            for p in self.parts
        }
        for p in self.parts:
            new_params = p.adjust_params(new_params, parts[p.name])
        return new_params, {**server_state, "opt": opt_state, "parts": parts}

    def message_nbytes(
        self, params: Params, server_state: dict, round_: int | None = None
    ) -> tuple[int, int]:
        """Bytes (down, up) per sampled client: model + broadcast down, delta + uploads up."""
        down = tree_nbytes(params) + tree_nbytes(self.broadcast(server_state))
        extra = sum(getattr(p, "uplink_models", 0.0) for p in self.parts)
        if self.codec is not None:  # the delta's exact encoded size (values + indices + seeds)
            return down, int(self.codec.nbytes(params, round_) + tree_nbytes(params) * extra)
        up = tree_nbytes(params) * (1 + extra)
        return down, int(up)


AlgorithmFactory = Callable[..., Algorithm]
