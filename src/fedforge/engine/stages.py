"""A client's local round as one plain step loop wrapped by a chain of stages.

The loop (:func:`fedforge.engine.local.run_steps`) only takes a gradient on each step's batch
and one step of the algorithm's local optimizer. Every capability a round may add is a
:class:`Stage`: three pure hooks around that loop, optax's shape one level up:

* ``begin(start, ctx, train) -> (start, ctx)``, before the loop: where the round starts (a
  personal method's own leaves; a phase trained first with ``train``, the same loop);
* ``step(step, ctx, data) -> step``: how every local step runs (:class:`Step`: the gradient
  the optimizer gets, the context it sees, whether a padded step counts);
* ``finish(upload, trained, ctx) -> upload``, after the loop: what the client sends and
  keeps (:class:`Upload`: the shared delta, clipped and noised, the parts' state and
  uploads, the codec's message).

:func:`chain` runs stages in the order given and refuses, in one line naming both, a stage
placed before one it must follow (each stage lists those in ``after``).
:func:`local_stages` builds an algorithm's chain from its typed fields, in the order
``docs/architecture.md`` draws::

    dropout -> frozen_bf16 -> padding -> personal -> stochastic_rounding -> objective
      -> step_batch -> privacy -> parts -> codec

A new capability (LoRA adapters, say) is a new stage, not a branch in the loop: write the
hooks it needs (the defaults leave the round as it is), list in ``after`` the stages whose
work it must see (or add its name to the ``after`` of a stage that must see its work), and
add it to :func:`local_stages` where the algorithm carries it.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import NamedTuple

import torch

from fedforge.client.transforms import RoundContext
from fedforge.comm.codec import Codec
from fedforge.core.tree import Params, tree_where
from fedforge.engine.frozen_casts import Target, cast, loss_targets, swapped
from fedforge.engine.randomness import CLIENT_KEY, KeyedRandomness, is_keyed, no_key
from fedforge.engine.rounding import (
    STOCHASTIC,
    nearest,
    random_bits,
    rounding_key,
    stochastic_round,
)
from fedforge.protocol.algorithm import (
    LOCAL_STEP,
    Algorithm,
    FinalizeInputs,
    LocalObjective,
    PersonalSpec,
    PrivacyMechanism,
)
from fedforge.protocol.step_batch import StepBatch, with_step_batch

LossFn = Callable[[Params, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# (params, x, y, w) -> (gradient, loss): through torch.func, or autograd for one client
GradFn = Callable[[Params, torch.Tensor, torch.Tensor, torch.Tensor], tuple[Params, torch.Tensor]]


class ClientData(NamedTuple):
    """One client's batches of the round."""

    xs: torch.Tensor  # [steps, batch, ...]
    ys: torch.Tensor  # [steps, batch]
    ws: torch.Tensor  # [steps, batch], 0 = padding


class Batch(NamedTuple):
    """One local step's batch."""

    index: int  # the step k of the round's schedule (the same in every pass)
    x: torch.Tensor  # [batch, ...]
    y: torch.Tensor  # [batch]
    w: torch.Tensor  # [batch], 0 = padding


class Local(NamedTuple):
    """What a local step changes."""

    params: Params
    opt_state: dict


class Step(NamedTuple):
    """How one local step runs, as the stages so far made it (:func:`plain_step` first)."""

    loss_grad: GradFn  # the loss's gradient and value at any point, on any weights
    grad: Callable[[Params, Batch], tuple[Params, torch.Tensor]]  # what the optimizer gets
    around: Callable[[Batch], AbstractContextManager]  # each model evaluation runs inside
    context: Callable[[RoundContext, Batch], RoundContext]  # the optimizer's context
    # (batch, before, after, loss) -> (what the step leaves, its weight in the sums)
    accept: Callable[[Batch, Local, Local, torch.Tensor], tuple[Local, torch.Tensor | float]]
    grad_sum: bool = False  # the loop sums the raw gradients of the steps taken


class Trained(NamedTuple):
    """What the step loop leaves (``train`` returns it; ``[0]`` is the parameters)."""

    params: Params  # x_i after the steps
    opt_state: dict  # the local optimizer's final state, keyed by transform name
    loss_sum: torch.Tensor  # sum of the steps' losses (0-d)
    steps: torch.Tensor  # steps taken (0-d)
    grad_sum: Params | None  # sum of the raw gradients, when a stage asks for it


# train(start, optimizer, ctx, passes=1) -> Trained: the loop over the round's batches
Train = Callable[..., Trained]


def _all_sent(delta: Params) -> Params:
    return delta


class Upload(NamedTuple):
    """What the client sends and keeps, as the finish hooks shape it."""

    delta: Params  # x^t - x_i, then what is sent instead (shared, clipped, encoded)
    client_state: dict  # the client's new persistent state, by part name
    uploads: dict  # tensors averaged over the cohort, by part name
    diagnostics: dict  # per-client 0-d metrics, logged as cohort means
    only_sent: Callable[[Params], Params] = _all_sent  # zeroes the leaves never sent


Begin = Callable[[Params, RoundContext, Train], tuple[Params, RoundContext]]
StepHook = Callable[[Step, RoundContext, ClientData], Step]
Finish = Callable[[Upload, Trained, RoundContext], Upload]


def _begin_as_is(start: Params, ctx: RoundContext, train: Train):
    return start, ctx


def _step_as_is(step: Step, ctx: RoundContext, data: ClientData) -> Step:
    return step


def _finish_as_is(upload: Upload, trained: Trained, ctx: RoundContext) -> Upload:
    return upload


class Stage(NamedTuple):
    """One capability of the local round: hooks before, at every step, and after the loop."""

    name: str
    begin: Begin = _begin_as_is
    step: StepHook = _step_as_is
    finish: Finish = _finish_as_is
    after: tuple[str, ...] = ()  # stages that, when in the chain, must come before this one
    # whether a hook may keep a step's parameters past the step (``padding``'s select of
    # the step before), which an update in place would change under it; ``True`` (the safe
    # answer) unless the stage says otherwise
    keeps_params: bool = True


class Chain(NamedTuple):
    """Stages applied in order: every hook of one stage sees what the earlier ones made."""

    stages: tuple[Stage, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.stages)

    @property
    def keeps_params(self) -> bool:
        """Whether some stage keeps a step's parameters (then no update runs in place)."""
        return any(s.keeps_params for s in self.stages)

    def begin(self, start: Params, ctx: RoundContext, train: Train
              ) -> tuple[Params, RoundContext]:
        for s in self.stages:
            start, ctx = s.begin(start, ctx, train)
        return start, ctx

    def step(self, step: Step, ctx: RoundContext, data: ClientData) -> Step:
        for s in self.stages:
            step = s.step(step, ctx, data)
        return step

    def finish(self, upload: Upload, trained: Trained, ctx: RoundContext) -> Upload:
        for s in self.stages:
            upload = s.finish(upload, trained, ctx)
        return upload


def chain(*stages: Stage) -> Chain:
    """The stages in this order; refused when a name repeats or a stage comes before one of
    its ``after``."""
    names = [s.name for s in stages]
    if len(set(names)) != len(names):
        raise ValueError(f"local update stages: duplicate names in {' -> '.join(names)}")
    for i, s in enumerate(stages):
        for first in s.after:
            if first in names[i + 1:]:
                raise ValueError(f"local update stages: {s.name!r} must come after {first!r}, "
                                 f"got {' -> '.join(names)}")
    return Chain(tuple(stages))


def _take(batch: Batch, before: Local, after: Local, loss: torch.Tensor):
    return after, 1.0


def plain_step(loss_grad: GradFn) -> Step:
    """A step on the batch's gradient, in no context, that always counts."""
    return Step(loss_grad, lambda params, b: loss_grad(params, b.x, b.y, b.w),
                lambda b: nullcontext(), lambda ctx, b: ctx, _take)


# --- the stages --------------------------------------------------------------------------

def dropout_keys(engine: str) -> Stage:
    """Dropout masks from (client key, step, layer) in every model evaluation, so every
    engine draws the same (:mod:`fedforge.engine.randomness`); a client whose round inputs
    carry no key gets key 0. ``engine`` names the engine in the refusal of a random layer."""

    def step(s: Step, ctx: RoundContext, data: ClientData) -> Step:
        key = ctx.info.get(CLIENT_KEY)
        if key is None:
            key = no_key(data.ws.device)
        return s._replace(around=lambda b: KeyedRandomness(key, b.index, engine))

    return Stage("dropout", step=step, keeps_params=False)


def frozen_bf16(targets: list[Target]) -> Stage:
    """Frozen weights in bf16 for the whole round (:mod:`fedforge.engine.frozen_casts`):
    cast once when the round starts, held by their layers around each step's model
    evaluations, so bf16 autocast finds nothing to cast; the same bits as its casts. A
    compiled round is left as it is (its graph casts each weight once)."""

    def step(s: Step, ctx: RoundContext, data: ClientData) -> Step:
        if torch.compiler.is_compiling():
            return s
        casts, around = cast(targets), s.around

        @contextmanager
        def both(b: Batch):
            with around(b), swapped(casts):
                yield

        return s._replace(around=both)

    return Stage("frozen_bf16", step=step, after=("dropout",), keeps_params=False)


def padding_masks() -> Stage:
    """A step whose weights are all zero (a client out of data) leaves the parameters and
    the optimizer state as they were and counts for nothing, with selects, not branches."""

    def accept(batch: Batch, before: Local, after: Local, loss: torch.Tensor):
        active = batch.w.sum() > 0
        kept = Local(tree_where(active, after.params, before.params),
                     tree_where(active, after.opt_state, before.opt_state))
        return kept, active.to(loss.dtype)

    # it keeps the step before, to select it
    return Stage("padding", step=lambda s, ctx, data: s._replace(accept=accept))


def personal_stage(spec: PersonalSpec) -> Stage:
    """A personal method's own parameters: the round starts where the spec says (the
    client's own leaves, after a first phase or beside a side model) and the leaves the
    client keeps are never sent."""

    def begin(start: Params, ctx: RoundContext, train: Train):
        del start  # the spec starts from the global model and the client's own leaves
        return spec.begin(train, ctx)

    def finish(up: Upload, trained: Trained, ctx: RoundContext) -> Upload:
        return up._replace(delta=spec.shared(up.delta), only_sent=spec.shared)

    return Stage("personal", begin=begin, finish=finish, keeps_params=False)


def stochastic_rounding() -> Stage:
    """bf16 weights for the round (:mod:`fedforge.engine.rounding`): the start rounded to
    the nearest bf16 value, every step's float32 weights stochastically rounded to bf16
    under the keys of (client, step, parameter). float64 leaves are left as they are."""

    def begin(start: Params, ctx: RoundContext, train: Train):
        return {k: nearest(v) if v.dtype == torch.float32 else v
                for k, v in start.items()}, ctx

    def step(s: Step, ctx: RoundContext, data: ClientData) -> Step:
        key, accept = ctx.info.get(CLIENT_KEY), s.accept
        if key is None:
            key = no_key(data.ws.device)

        def rounded(batch: Batch, before: Local, after: Local, loss: torch.Tensor):
            kept, a = accept(batch, before, after, loss)
            with torch.no_grad():
                params = {k: stochastic_round(v, random_bits(
                              rounding_key(key, batch.index, j), v.shape, v.device))
                          if v.dtype == torch.float32 else v
                          for j, (k, v) in enumerate(kept.params.items())}
            return kept._replace(params=params), a

        return s._replace(accept=rounded)

    return Stage("stochastic_rounding", begin=begin, step=step, after=("padding", "personal"),
                 keeps_params=False)


def objective_stage(objective: LocalObjective) -> Stage:
    """A local loss other than the run's (:attr:`Algorithm.objective`, MOON's): its gradient,
    on the step's batch and in the round's context, is what the optimizer gets and what every
    later stage takes as the loss's (``loss_grad``). The step's own gradient sees the step's
    index in ``ctx.info[LOCAL_STEP]``, so an objective may draw fresh inputs at every step
    (FedGen's generated latents)."""
    grad_and_value = torch.func.grad_and_value(objective.loss)

    def step(s: Step, ctx: RoundContext, data: ClientData) -> Step:
        def loss_grad(params: Params, x, y, w):
            return grad_and_value(params, x, y, w, ctx)

        def grad(params: Params, b: Batch):
            at_step = ctx._replace(info={**ctx.info, LOCAL_STEP: b.index})
            return grad_and_value(params, b.x, b.y, b.w, at_step)

        return s._replace(loss_grad=loss_grad, grad=grad)

    return Stage("objective", step=step, keeps_params=False)


def step_batch() -> Stage:
    """The step's batch in the optimizer's context (:mod:`fedforge.protocol.step_batch`),
    for a local step that takes gradients at other points of it (APFL, pFedMe, ...)."""

    def step(s: Step, ctx: RoundContext, data: ClientData) -> Step:
        def context(ctx: RoundContext, b: Batch) -> RoundContext:
            def grad(at: Params, weights: torch.Tensor | None = None) -> Params:
                with s.around(b):  # the step's dropout masks, as the loop's gradient
                    return s.loss_grad(at, b.x, b.y, b.w if weights is None else weights)[0]

            return with_step_batch(s.context(ctx, b),
                                   StepBatch(grad, b.y, b.w, data.ys, data.ws, b.x,
                                             lambda: s.around(b)))

        return s._replace(context=context)

    return Stage("step_batch", step=step, after=("dropout", "objective"), keeps_params=False)


def privacy_stage(mechanism: PrivacyMechanism, loss_fn: LossFn) -> Stage:
    """Differential privacy: DP-SGD's clipped and noised gradient at each step (per sample),
    or the client's delta clipped, and noised for local DP (per client). It clips what the
    client sends, so it comes after ``personal``; leaves never sent get no noise."""

    def step(s: Step, ctx: RoundContext, data: ClientData) -> Step:
        grad = mechanism.step_grad(s.loss_grad, loss_fn, ctx.info)
        return s._replace(grad=lambda params, b: grad(params, b.x, b.y, b.w, b.index))

    def finish(up: Upload, trained: Trained, ctx: RoundContext) -> Upload:
        delta, uploads = mechanism.client_delta(up.delta, ctx.broadcast, ctx.info)
        return up._replace(delta=up.only_sent(delta), uploads={**up.uploads, **uploads})

    return Stage("privacy", step=step, finish=finish, after=("personal", "objective"),
                 keeps_params=False)


def parts_stage(algorithm: Algorithm) -> Stage:
    """The algorithm's parts: what the client keeps and uploads when its round ends, from
    the delta it sends (after ``personal`` and ``privacy``), and their diagnostics."""
    sums = algorithm.needs_grad_sum

    def step(s: Step, ctx: RoundContext, data: ClientData) -> Step:
        return s._replace(grad_sum=True) if sums else s

    def finish(up: Upload, trained: Trained, ctx: RoundContext) -> Upload:
        fin = FinalizeInputs(ctx, up.delta, trained.params, trained.opt_state,
                             trained.grad_sum, trained.steps)
        states, uploads = algorithm.finalize(fin)
        return up._replace(client_state={**states, **up.client_state},
                           uploads={**uploads, **up.uploads},  # the parts' listed first
                           diagnostics={**up.diagnostics, **algorithm.client_metrics(fin)})

    return Stage("parts", step=step, finish=finish, after=("personal", "privacy"),
                 keeps_params=False)


def codec_stage(codec: Codec) -> Stage:
    """The uplink codec: the client sends its delta encoded (the engine averages the
    messages) and keeps the codec's state (error feedback's residual)."""

    def finish(up: Upload, trained: Trained, ctx: RoundContext) -> Upload:
        message, state = codec.encode(up.delta, ctx.client_state.get("codec", {}), ctx)
        kept = {**up.client_state, "codec": state} if state else up.client_state
        return up._replace(delta=message, client_state=kept)

    return Stage("codec", finish=finish, after=("privacy", "parts"), keeps_params=False)


def local_stages(algorithm: Algorithm, loss_fn: LossFn, *, masked: bool,
                 engine: str = "loop") -> Chain:
    """The chain of ``algorithm``'s local round, from its typed fields and the loss's model.

    Args:
      masked: some steps of some clients are padding (all weights zero); without it the
        ``padding`` stage, and its selects, are left out.
      engine: the engine's name, for the one-line refusal of a random layer it cannot key.
    """
    stages = []
    if is_keyed(loss_fn):  # dropout layers
        stages.append(dropout_keys(engine))
    targets = loss_targets(loss_fn) if algorithm.objective is None else []
    if targets:  # bf16 over frozen layers; an objective's own loss may run in float32
        stages.append(frozen_bf16(targets))
    if masked:
        stages.append(padding_masks())
    if (personal := algorithm.personal) is not None:
        stages.append(personal_stage(personal))
    if getattr(loss_fn, "precision", None) == STOCHASTIC:
        stages.append(stochastic_rounding())
    if algorithm.objective is not None:
        stages.append(objective_stage(algorithm.objective))
    if personal is not None and personal.step_batch:
        stages.append(step_batch())
    if algorithm.privacy is not None:
        stages.append(privacy_stage(algorithm.privacy, loss_fn))
    stages.append(parts_stage(algorithm))
    if algorithm.codec is not None:
        stages.append(codec_stage(algorithm.codec))
    return chain(*stages)
