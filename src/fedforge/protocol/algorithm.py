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
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import NamedTuple, Protocol

import torch

from fedforge.client.transforms import RoundContext, Transform
from fedforge.comm.codec import Codec
from fedforge.core.tree import Params, tree_map, tree_nbytes
from fedforge.server.chain import (
    Aggregate,
    ServerChain,
    ServerState,
    ServerTransform,
    decode_stage,
    optimizer_stage,
    parts_stage,
)
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


# Extra work done around the local round (FedPTR's trajectory matching): wall seconds and
# per-sample gradients, per client ``[C]`` and on the server (0-d). The runner charges the
# samples to simulated time and logs the cumulative seconds as ``prep_s``.
PREP_SECONDS, PREP_SAMPLES = "prep_s", "prep_samples"
SERVER_PREP_SECONDS, SERVER_PREP_SAMPLES = "server_prep_s", "server_prep_samples"


class Part:
    """A stateful add-on; subclasses override what they need. Default: stateless."""

    name: str = "part"
    # models' worth of uploads a client sends beside its delta, for an algorithm whose model
    # travels (SCAFFOLD's dc: 1; a scalar: 0); message_nbytes adds them to the delta's bytes
    uplink_models: float = 0.0

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

    def client_metrics(self, fin: FinalizeInputs) -> dict:
        """Per-client diagnostics (0-d tensors) at the end of the local round; the runner logs
        their mean over the clients that trained under the same keys."""
        return {}

    def server_metrics(self, server_state: dict, client_states: dict) -> dict:
        """Diagnostics at evaluation time from this part's server state and every client's
        stored state (``client_states`` stacked ``[N, ...]``; a rank's rows under torchrun)."""
        return {}

    def server_update(self, server_state: dict, mean_uploads: dict, agg: Aggregate) -> dict:
        """This part's new server state from the mean of its uploads over the aggregate."""
        return server_state

    # Whether an overridden ``finalize`` may return uploads (a need a driver must serve);
    # False for a part that only keeps its client state, such as a personal model.
    sends_uploads: bool = True

    # How the server averages this part's uploads over the aggregate's clients: "uniform"
    # (1/S) or "num_samples" (n_i / n over those clients, n_i the client's training samples;
    # FedNova's normalised updates). The deltas keep ``Algorithm.aggregation``.
    upload_weights: str = "uniform"

    def round_info(self, num_sampled: int, generator: torch.Generator) -> dict:
        """Per-client round inputs (e.g. which sampled clients track), tensors of [num_sampled]."""
        return {}

    needs_grad_sum: bool = False

    # True: this part's upload_nbytes / download_nbytes change from round to round (FLoRA's
    # stack), so the drivers ask again after every server step
    nbytes_by_round: bool = False

    # True: the engine puts each sampled client's id in its round inputs (info[CLIENT_ID]),
    # for a part that keeps one server value per client (AFL's mixture weights)
    needs_client_ids: bool = False

    def bind_population(self, num_clients: int) -> None:
        """Told the number of clients N before any server state is built (the runner)."""

    # --- optional hooks for parts that do non-vmappable work around the local round ----
    prepares: bool = False  # True: prepare_cohort / server_prepare are called (FedPTR)

    def bind_data(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        """Told the dataset's sample shape and class count before any state is built."""

    def bind_eval(self, evaluate: Callable[[Params], dict]) -> None:
        """Given ``evaluate(params) -> {"test_accuracy": ...}`` on the run's test set, for
        diagnostics of models other than the global one (FedPTR's projected model)."""

    def bind_model(self, model: torch.nn.Module) -> None:
        """Given the run's model (its modules, not its values), for a local step that needs
        more of a forward pass than the loss (FedProto's features at the head's input)."""

    def upload_nbytes(self, params: Params, server_state: dict) -> int:
        """Bytes of this part's uploads per client that :attr:`uplink_models` does not count:
        all of them for an algorithm whose model never travels (:attr:`Algorithm.sends_model`
        False), else what travels beside the model (FedGen's label counts)."""
        return 0

    def download_nbytes(self, params: Params, server_state: dict) -> int:
        """Bytes each client receives of this part, for an algorithm whose model never travels:
        its broadcast (CFL sends a client only its own cluster's model)."""
        return tree_nbytes(self.broadcast(server_state))

    def prepare_cohort(self, prep: PrepareInputs) -> tuple[dict, dict, dict]:
        """Before local training, per cohort, eagerly (not vmapped, same for every engine).

        -> (this part's new stacked client states, extra per-client info [C, ...] merged into
        the round's info, metrics: :data:`PREP_SECONDS` and :data:`PREP_SAMPLES`, ``[C]``).
        """
        return prep.client_states.get(self.name, {}), {}, {}

    def server_prepare(
        self, params: Params, server_state: dict, loss_fn: Callable
    ) -> tuple[dict, dict]:
        """At the start of a round, on the server, seeing the current global model x^t
        (arguments in the order of :meth:`Algorithm.server_prepare` and :meth:`adjust_params`)

        -> (this part's new server state, metrics: :data:`SERVER_PREP_SECONDS` and
        :data:`SERVER_PREP_SAMPLES`, 0-d).
        """
        return server_state, {}

    def adjust_params(self, params: Params, server_state: dict) -> Params:
        """After the server step: a correction of the new global model (FedDyn's -h/α)."""
        return params


# What a driver may be asked to serve (see :attr:`Algorithm.needs`).
NEEDS = {
    "client_state": "per-client state kept between rounds",
    "uploads": "per-client uploads besides the delta",
    "codec": "an uplink codec",
    "prepare": "eager per-cohort work before local training",
    "round_info": "per-client random inputs drawn each round",
    "full_participation": "every client in every round",
    "weighted_uploads": "part uploads averaged with the clients' sample counts",
    "privacy": "clipped and noised updates with a privacy ledger (differential privacy)",
    "model": "the run's model bound to the algorithm (bind_model)",
    "client_ids": "each sampled client's id in its round inputs",
}

CLIENT_ID = "client_id"
"""Round-input key of each sampled client's id (a long tensor ``[C]``), for an algorithm
whose parts set ``needs_client_ids``. Set by ``engine/round.py``."""

LOCAL_STEP = "local_step"
"""Context-info key of the local step's index ``k`` (a Python int) while the ``objective``
stage takes that step's gradient, for an objective drawing fresh random inputs at every step
(FedGen's generated latents). Set by ``engine/stages.py:objective_stage``."""

UPLOAD_SCALE = "upload_scale"
"""Round-input key of ``S n_i / sum_j n_j`` per client: a ``num_samples`` part's uploads are
multiplied by it when the client finalizes, so the engine's uniform mean is the weighted one
(every engine, chunking and torchrun sums unchanged). Set by ``engine/round.py``."""


def check_support(algorithm: Algorithm, template: Params, field: str, driver: str,
                  serves: frozenset[str]) -> None:
    """Refuse, in one line naming the algorithm and the driver, what a driver cannot serve."""
    unserved = sorted(algorithm.needs(template) - serves)
    if unserved:
        what = ", ".join(NEEDS[n] for n in unserved)
        raise ValueError(f"{field}: {algorithm.name!r} needs {what}, which the {driver} "
                         f"cannot serve; choose another method or algorithm")


class PrivacyMechanism(Protocol):
    """What the engine and the runner ask of a differential-privacy mechanism.

    ``fedforge.privacy`` implements it; it is declared here, with the algorithm that carries
    it (:attr:`Algorithm.privacy`), so that neither the engine nor the runner imports the
    privacy package to run a round, and nothing probes an algorithm for it."""

    def sample_cohort(self, generator: torch.Generator) -> torch.Tensor:
        """The round's cohort (Poisson sampling), sorted client ids."""

    def aggregation_weights(self, weights: torch.Tensor) -> torch.Tensor:
        """The weights of the cohort's deltas in the mean (central DP: fixed ``1/(qN)``)."""

    def empty_round(self, algorithm: Algorithm, params: Params, server_state: ServerState,
                    num_clients: int, round_: int) -> object:
        """The engine's round result of a round whose cohort is empty (the server still
        steps: central DP releases its noise and the accountant counts the round)."""

    def step_grad(self, grad_and_loss: Callable, loss_fn: Callable, info: dict) -> Callable:
        """``(params, x, y, w, step) -> (grads, loss)`` of one local step (DP-SGD)."""

    def client_delta(self, delta: Params, broadcast: dict, info: dict) -> tuple[Params, dict]:
        """The delta a client uploads (clipped, maybe noised) and its privacy uploads."""

    def last_round(self, rounds: int) -> int:
        """The last round whose spending stays within the target ε."""

    def ledger_meta(self, rounds: int) -> dict:
        """The checkpoint meta's privacy ledger after ``rounds`` rounds."""


GLOBAL_METRIC = "test_accuracy"
"""What a method without a personal model is judged by: the global model on the pooled test set."""
PERSONAL_METRIC = "personal_accuracy_mean"
"""What a personalised method is judged by: the mean over clients of the personalised model's
accuracy on each client's own held-out data (fedforge.experiment.personal_eval)."""
FAIRNESS_METRICS = ("personal_accuracy_worst", "personal_accuracy_p10",
                    "global_accuracy_worst", "global_accuracy_p10")
"""What a fairness method may be judged by (its ``primary_metric``)."""


class PersonalSpec(Protocol):
    """What the engine's local round, the personalised evaluation and differential privacy
    ask of a personalised method. :class:`fedforge.algorithms.personal.Personal` implements
    it; it is declared here, with the algorithm that carries it (:attr:`Algorithm.personal`),
    so they read a typed field and never probe an algorithm for it."""

    step_batch: bool  # its local step takes gradients at other points of the step's batch
    finetune_steps: int  # the method's own evaluation-time fine-tuning steps

    def begin(self, train: Callable, ctx: RoundContext) -> tuple[Params, RoundContext]:
        """Where the client's shared round starts, and the context it runs in."""

    def shared(self, delta: Params) -> Params:
        """The delta a client sends (its kept leaves zeroed)."""

    def client_params(self, global_params: Params, state: dict) -> Params:
        """One client's personal model from its stored state."""

    def finetuner(self) -> Algorithm | None:
        """The algorithm whose local round is the evaluation-time fine-tuning, if any."""

    def kept_names(self, params: Params) -> frozenset[str]:
        """The leaves no client sends (zero in every delta; no DP noise on them)."""

    def covered_by_dp_sgd(self) -> bool:
        """Whether DP-SGD covers the delta a client sends (privacy mode ``sample``)."""

    def evaluated_at(self, parts: dict) -> PersonalSpec:
        """The spec an evaluation at these server part states uses (a clustered method's
        personal model is its cluster's model, held by the server)."""

    def client_columns(self, states: dict, count: int) -> dict[str, torch.Tensor]:
        """Extra columns of the per-client metrics file (a clustered method's cluster)."""

    def accuracies(self, model: torch.nn.Module, models: Params, x: torch.Tensor,
                   y: torch.Tensor, indices: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """``{name}_accuracy`` ``[C]`` of the clients' stacked ``models`` on ``x[indices[c]]``
        by the method's own inference rule, beside the head's (FedProto's nearest
        prototype)."""


class LocalObjective(Protocol):
    """A local loss other than the run's, which reads the round's context besides the step's
    batch (MOON's contrastive term: forward passes of the global and the client's previous
    model). The engine's ``objective`` stage differentiates it at every local step instead
    of the run's loss; it is declared here, with the algorithm that carries it
    (:attr:`Algorithm.objective`), so the engine reads a typed field."""

    def loss(self, params: Params, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
             ctx: RoundContext) -> torch.Tensor:
        """The masked mean loss of one step's batch at ``params`` (``w`` [B], 0 = padding);
        at the step's own gradient ``ctx.info[LOCAL_STEP]`` is the step's index."""


@dataclass(frozen=True)
class Algorithm:
    """``(local_optimizer, parts, server optimizer, codec)`` plus paper defaults.

    ``server_optimizer`` is a :class:`ServerOptimizer` on Δ or a whole
    :class:`~fedforge.server.chain.ServerTransform` (FedExP's extrapolation); the server step
    is the chain :attr:`server` built from these, the same for every driver.
    ``aggregation`` is how the driver weights the deltas: ``"num_samples"`` (n_i / n, as in
    McMahan et al.) or ``"uniform"`` (1/S).
    """

    name: str
    local_optimizer: Transform
    server_optimizer: ServerOptimizer | ServerTransform
    parts: tuple[Part, ...] = ()
    description: str = ""
    hparams: dict = field(default_factory=dict)
    codec: Codec | None = None  # uplink codec (fedforge.comm.codec): encode/average/decode
    aggregation: str = "uniform"
    # needs the maths declares rather than the parts show (MARINA: full_participation)
    requires: frozenset[str] = frozenset()
    # differential privacy (fedforge.privacy sets it on a private run's algorithm); the engine
    # and the runner read this field, and a driver that cannot serve it refuses the need
    privacy: PrivacyMechanism | None = None
    # personalised FL (fedforge.algorithms.personal sets it on a personalised method): where
    # a client's round starts, what it sends, its personal model at evaluation
    personal: PersonalSpec | None = None
    # a local loss other than the run's (MOON's): every local step descends its gradient
    objective: LocalObjective | None = None
    # False: no model travels, down or up (FedProto sends class prototypes): the bytes are
    # the broadcast down and the parts' uploads up
    sends_model: bool = True
    # the metric the method is judged by (compare, report, plot and sweep default to it):
    # None is its kind's, :data:`PERSONAL_METRIC` for a personalised method, else
    # :data:`GLOBAL_METRIC`; a fairness method names the worst-client or 10th-percentile one
    primary_metric: str | None = None

    @property
    def judged_by(self) -> str:
        """The metrics key :attr:`primary_metric` names, or its kind's default."""
        if self.primary_metric is not None:
            return self.primary_metric
        return GLOBAL_METRIC if self.personal is None else PERSONAL_METRIC

    @property
    def steps_on_mean_delta(self) -> bool:
        """Whether the server moves the model from the mean delta, the one value a robust
        aggregator replaces: not where the server stage steps from the parts' uploads
        (FedNova, q-FFL, AFL) or no model travels (FedProto)."""
        opt = self.server_optimizer
        return self.sends_model and (not isinstance(opt, ServerTransform) or opt.reads_delta)

    @property
    def needs_grad_sum(self) -> bool:
        return any(p.needs_grad_sum for p in self.parts)

    @property
    def nbytes_by_round(self) -> bool:
        """Whether :meth:`message_nbytes` changes from round to round (a codec's encoded
        size, a part's own bytes)."""
        return self.codec is not None or any(p.nbytes_by_round for p in self.parts)

    def needs(self, params: Params) -> frozenset[str]:
        """What a driver must serve to run this algorithm (keys of :data:`NEEDS`)."""
        needs = set(self.requires)
        if self.client_init(params):
            needs.add("client_state")
        if any(type(p).finalize is not Part.finalize and p.sends_uploads for p in self.parts):
            needs.add("uploads")
        if self.codec is not None:
            needs.add("codec")
        if self.weights_uploads:
            needs.add("weighted_uploads")
        if self.prepares:
            needs.add("prepare")
        if self.round_info(2, torch.Generator().manual_seed(0)):
            needs.add("round_info")
        if self.privacy is not None:
            needs.add("privacy")
        if any(type(p).bind_model is not Part.bind_model for p in self.parts):
            needs.add("model")
        if self.needs_client_ids:
            needs.add("client_ids")
        return frozenset(needs)

    # --- client side -----------------------------------------------------------------
    def client_init(self, params: Params) -> dict:
        states = {p.name: p.client_init(params) for p in self.parts}
        if self.codec is not None:  # EF residual / MARINA's last delta, in the client store
            states["codec"] = self.codec.client_init(params)
        return {name: state for name, state in states.items() if state}

    @property
    def weights_uploads(self) -> bool:
        """Whether a part's uploads are averaged with the clients' sample counts."""
        for p in self.parts:
            if p.upload_weights not in ("uniform", "num_samples"):
                raise ValueError(f"part {p.name!r}: upload_weights must be 'uniform' or "
                                 f"'num_samples', got {p.upload_weights!r}")
        return any(p.upload_weights == "num_samples" for p in self.parts)

    def finalize(self, fin: FinalizeInputs) -> tuple[dict, dict]:
        states, uploads = {}, {}
        for p in self.parts:
            state, up = p.finalize(fin)
            if p.name in fin.ctx.client_state:
                states[p.name] = state
            if up and p.upload_weights == "num_samples":  # see UPLOAD_SCALE
                scale = fin.ctx.info[UPLOAD_SCALE]
                up = tree_map(lambda u, s=scale: u * s.to(u.dtype), up)
            if up:
                uploads[p.name] = up
        return states, uploads

    def client_metrics(self, fin: FinalizeInputs) -> dict:
        out: dict = {}
        for p in self.parts:
            out.update(p.client_metrics(fin))
        return out

    def server_metrics(self, server_state: ServerState, client_states: dict) -> dict:
        """Every part's evaluation-time diagnostics as floats."""
        out: dict = {}
        for p in self.parts:
            m = p.server_metrics(server_state["parts"][p.name], client_states.get(p.name, {}))
            out.update({k: float(v) for k, v in m.items()})
        return out

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

    @property
    def needs_client_ids(self) -> bool:
        return any(p.needs_client_ids for p in self.parts)

    def bind_population(self, num_clients: int) -> None:
        """Tell every part the number of clients (the runner calls this)."""
        for p in self.parts:
            p.bind_population(int(num_clients))

    def bind_eval(self, evaluate: Callable[[Params], dict]) -> None:
        """Give every part the run's test-set scorer (the runner calls this)."""
        for p in self.parts:
            p.bind_eval(evaluate)

    def bind_model(self, model: torch.nn.Module) -> None:
        """Give every part the run's model (the runner calls this)."""
        for p in self.parts:
            p.bind_model(model)

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
        self, params: Params, server_state: ServerState, loss_fn: Callable
    ) -> tuple[ServerState, dict]:
        """-> (server state, metrics) after every preparing part's server hook."""
        parts, metrics = dict(server_state["parts"]), {}
        for p in self.parts:
            if p.prepares:
                parts[p.name], m = p.server_prepare(params, parts[p.name], loss_fn)
                metrics.update(m)
        return ServerState({**server_state.stages, "parts": parts}), metrics

    @property
    def prepares(self) -> bool:
        return any(p.prepares for p in self.parts)

    # --- server side -----------------------------------------------------------------
    @cached_property
    def server(self) -> ServerChain:
        """The server step: decode -> optimizer -> parts (built once, used by every driver)."""
        opt = self.server_optimizer
        stages = [] if self.codec is None else [decode_stage(self.codec)]
        stages.append(opt if isinstance(opt, ServerTransform) else optimizer_stage(opt))
        stages.append(parts_stage(self.parts))
        return ServerChain(tuple(stages))

    def server_init(self, params: Params) -> ServerState:
        return self.server.init(params)

    def server_step(self, params: Params, server_state: ServerState, aggregate: Aggregate
                    ) -> tuple[Params, ServerState]:
        """Fold ``aggregate`` in: decode, server optimizer, parts, post-adjustments."""
        return self.server.step(params, server_state, aggregate)

    def eval_params(self, params: Params, server_state: ServerState) -> Params:
        """Where the model is evaluated (``params`` unless a stage says otherwise)."""
        return self.server.eval_params(params, server_state)

    def evaluated_at(self, server_state: ServerState) -> Algorithm:
        """This algorithm as the personalised evaluation at ``server_state`` sees it."""
        if self.personal is None:
            return self
        spec = self.personal.evaluated_at(server_state["parts"])
        return self if spec is self.personal else replace(self, personal=spec)

    def broadcast(self, server_state: ServerState) -> dict:
        return {p.name: p.broadcast(server_state["parts"][p.name]) for p in self.parts}

    def message_nbytes(
        self, params: Params, server_state: ServerState, round_: int | None = None
    ) -> tuple[int, int]:
        """Bytes (down, up) per sampled client: model + broadcast down, delta + uploads up."""
        if not self.sends_model:
            return (int(sum(p.download_nbytes(params, server_state["parts"][p.name])
                            for p in self.parts)),
                    int(sum(p.upload_nbytes(params, server_state["parts"][p.name])
                            for p in self.parts)))
        down = tree_nbytes(params) + tree_nbytes(self.broadcast(server_state))
        extra = sum(p.uplink_models for p in self.parts)
        beside = sum(p.upload_nbytes(params, server_state["parts"][p.name]) for p in self.parts)
        if self.codec is not None:  # the delta's exact encoded size (values + indices + seeds)
            return down, int(self.codec.nbytes(params, round_) + tree_nbytes(params) * extra
                             + beside)
        up = tree_nbytes(params) * (1 + extra)
        return down, int(up) + int(beside)


AlgorithmFactory = Callable[..., Algorithm]
