"""FLoRA: federated LoRA whose round aggregate is exactly the weighted mean of the clients'
products ``B_k A_k``, whatever each client's rank.

Reference: Wang et al., "FLoRA: Federated Fine-Tuning Large Language Models with
Heterogeneous Low-Rank Adaptations", NeurIPS 2024 (official code ATP-1010/FederatedLLM).

FedIT averages A and B separately, and ``mean(B) mean(A)`` is not ``mean(B A)``. FLoRA
stacks instead: ``A = [p_1 A_1; ...; p_K A_K]`` (rows) and ``B = [B_1, ..., B_K]``
(columns), so ``B A = sum_k p_k B_k A_k`` exactly, with ``p_k = n_k / sum_j n_j``
(``fed_utils/model_aggregation.py``: A scaled by p_k, B concatenated as it is). Every client
merges the stacked product into its base model and starts the next round from a fresh
adapter (``main.py``: ``merge_and_unload``, then a new LoRA model per client and round:
A Kaiming-uniform, B zero).

How fedforge runs it:

* the model is ``pretrained`` with ``model.options.fold_adapters = true``: each target
  linear's ``weight`` is a leaf (float32), which no local step moves;
* client ``i`` trains rank ``ranks[i % len(ranks)]`` inside the model's ``r``-row adapter
  (default: every client ``r``): its B columns and A rows past its rank stay zero. Each
  client's adapter is scaled by the model's ``lora_alpha / r``, as the official code keeps
  ``alpha / r`` the same for every rank (``lora_alpha = 2 * rank``);
* each client uploads its factors in its slot of the cohort's stack (a one-hot round input),
  A with weight ``p_k``, so the engine's sum over the cohort *is* the stack;
* the server adds ``scaling * B A`` to the target weights, averages every other leaf (the
  head) by samples as FedAvg, and starts the next round from A drawn from ``(seed, round)``
  and B zero, which every client can draw itself.

Bytes: up, a client's own adapter (``rank * (in + out)`` per target) and the head; down,
the stacked A and B of the previous round and the head. The stack sent down is the one
round's: a client that missed rounds would also need theirs, which is not counted (every
client joins every round in the paper's runs).

On a model without adapters (no ``lora_A`` leaves) FLoRA is FedAvg.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from fedforge.algorithms.defaults import defaults_from
from fedforge.client.optimizers import local_optimizer
from fedforge.client.transforms import RoundContext, Transform, chain
from fedforge.core.schedules import ScheduleLike
from fedforge.core.tree import Params
from fedforge.errors import ConfigError
from fedforge.models.lora import LoraLinear
from fedforge.protocol.algorithm import CLIENT_ID, UPLOAD_SCALE, Algorithm, FinalizeInputs, Part
from fedforge.server.chain import Aggregate, ServerTransform

NAME = "flora"
SLOT = "flora_slot"  # round input: each sampled client's one-hot slot in the cohort's stack
RANKS = "ranks"  # upload: each slot's rank


def adapters(params: Params) -> list[str]:
    """The adapted modules: names ``X`` with leaves ``X.lora_A``, ``X.lora_B``, ``X.weight``."""
    return [n.removesuffix(".lora_A") for n in params if n.endswith(".lora_A")]


def stack(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor], p: Sequence[float]
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """The paper's stacking of K clients' ``A_k`` [r_k, in] and ``B_k`` [out, r_k] with
    weights ``p_k``: ``B A = sum_k p_k B_k A_k``."""
    return (torch.cat([pk * ak for pk, ak in zip(p, a, strict=True)]),
            torch.cat(list(b), dim=1))


def client_rank(ranks: torch.Tensor, client_id: torch.Tensor) -> torch.Tensor:
    """``ranks[id % len(ranks)]`` as a 0-d tensor, by elementwise ops (vmappable)."""
    hit = torch.arange(len(ranks), device=client_id.device) == client_id % len(ranks)
    return (ranks.to(client_id.device) * hit).sum()


def rank_mask(rank: torch.Tensor, r: int, device: torch.device) -> torch.Tensor:
    """1 for the first ``rank`` of ``r`` adapter rows, 0 past them."""
    return (torch.arange(r, device=device) < rank).float()


class Stacking(Part):
    """Each client's factors in its slot of the stack; the server's bytes bookkeeping."""

    name = NAME
    upload_weights = "num_samples"  # A arrives as p_k A_k (B is divided back, finalize)
    needs_client_ids = True
    nbytes_by_round = True

    def __init__(self, ranks: tuple[int, ...]) -> None:
        self.ranks = ranks
        self.scaling: float | None = None

    def bind_model(self, model: nn.Module) -> None:
        scalings = {m.scaling for m in model.modules() if isinstance(m, LoraLinear)}
        if len(scalings) > 1:
            raise ConfigError(f"algorithm.name = 'flora': the adapters' scalings differ "
                              f"({sorted(scalings)}); one LoRA config scales them all")
        self.scaling = next(iter(scalings), None)

    def round_info(self, num_sampled: int, generator: torch.Generator) -> dict:
        return {SLOT: torch.eye(num_sampled)}

    def rank_of(self, ctx: RoundContext, r: int) -> torch.Tensor:
        """This client's rank (the model's ``r`` when ``ranks`` is empty)."""
        if not self.ranks:
            return torch.tensor(r)
        return client_rank(torch.tensor(self.ranks), ctx.info[CLIENT_ID])

    def finalize(self, fin: FinalizeInputs) -> tuple[dict, dict]:
        slot, scale = fin.ctx.info[SLOT], fin.ctx.info[UPLOAD_SCALE]
        unscale = torch.where(scale > 0, 1.0 / scale.clamp_min(1e-30), 0.0)
        up, rank = {}, None
        for module in adapters(fin.params):
            a, b = fin.params[f"{module}.lora_A"], fin.params[f"{module}.lora_B"]
            rank = self.rank_of(fin.ctx, a.shape[0])
            keep = rank_mask(rank, a.shape[0], a.device).to(a.dtype)
            a_slot = slot.to(a.dtype)[:, None, None] * (a * keep[:, None])[None]
            b_slot = (b * keep)[:, None, :] * slot.to(b.dtype)[None, :, None]
            up[f"{module}.lora_A"] = a_slot.reshape(-1, a.shape[1])
            up[f"{module}.lora_B"] = (b_slot * unscale).reshape(b.shape[0], -1)
        if rank is not None:
            up[RANKS] = slot.to(scale.dtype) * rank.to(scale.dtype) * unscale
        return {}, up

    def server_init(self, params: Params) -> dict:
        check_adapters(params, self.ranks)
        zero = torch.zeros(())
        return {"stack_rank": zero, "sent_rank": zero, "cohort": zero}

    def server_update(self, server_state: dict, mean_uploads: dict, agg: Aggregate) -> dict:
        total = (mean_uploads[RANKS].sum() * agg.num_sampled if RANKS in mean_uploads
                 else torch.zeros(()))
        return {"stack_rank": total.round().cpu(), "sent_rank": server_state["stack_rank"],
                "cohort": torch.tensor(float(agg.num_sampled))}

    def upload_nbytes(self, params: Params, server_state: dict) -> int:
        per_rank = _per_rank_nbytes(params)
        cohort = float(server_state["cohort"])
        mean_rank = float(server_state["stack_rank"]) / cohort if cohort else 0.0
        return int(mean_rank * per_rank) + _other_nbytes(params)

    def download_nbytes(self, params: Params, server_state: dict) -> int:
        return int(float(server_state["sent_rank"]) * _per_rank_nbytes(params)
                   ) + _other_nbytes(params)


def _per_rank_nbytes(params: Params) -> int:
    """Bytes of one rank of every adapter: a row of A and a column of B."""
    return sum((params[f"{m}.lora_A"].shape[1] + params[f"{m}.lora_B"].shape[0])
               * params[f"{m}.lora_A"].element_size() for m in adapters(params))


def _folded(params: Params) -> set[str]:
    """The adapters and the target weights: what does not travel as it is."""
    return {f"{m}.{leaf}" for m in adapters(params) for leaf in ("lora_A", "lora_B", "weight")}


def _other_nbytes(params: Params) -> int:
    """The head and every other leaf, which travel as in FedAvg."""
    folded = _folded(params)
    return sum(v.numel() * v.element_size() for k, v in params.items() if k not in folded)


def check_adapters(params: Params, ranks: tuple[int, ...]) -> None:
    """Refuse, in one line naming the field, a model FLoRA cannot fold into."""
    if any(n.endswith(".lora_B") and n.removesuffix("lora_B") + "lora_A" not in params
           for n in params):
        raise ConfigError("model.options.freeze_a: FLoRA draws a fresh A every round; "
                          "leave it false")
    for module in adapters(params):
        if f"{module}.weight" not in params:
            raise ConfigError("model.options.fold_adapters: FLoRA folds each round's adapters "
                              "into the target weights; set it to true")
        r = params[f"{module}.lora_A"].shape[0]
        if ranks and max(ranks) > r:
            raise ConfigError(f"algorithm.ranks: rank {max(ranks)} exceeds the adapters' "
                              f"r = {r} (model.options.adapters.r)")


def masked_adapters(part: Stacking, name: str) -> Transform:
    """No step on the target weights, nor on a client's adapter rows (A) or columns (B) past
    its rank: on the gradient (so a clip sees only what trains) and on the update."""

    def init(params: Params, ctx: RoundContext) -> dict:
        return {}

    def update(updates: Params, state: dict, params: Params, ctx: RoundContext):
        out = dict(updates)
        for module in adapters(params):
            a = f"{module}.lora_A"
            keep = rank_mask(part.rank_of(ctx, params[a].shape[0]), params[a].shape[0],
                             params[a].device).to(params[a].dtype)
            out[a] = updates[a] * keep[:, None]
            out[f"{module}.lora_B"] = updates[f"{module}.lora_B"] * keep
            out[f"{module}.weight"] = torch.zeros_like(updates[f"{module}.weight"])
        return out, state

    return Transform(name, init, update)


def fresh_a(params: Params, seed: int, round_: int) -> Params:
    """The next round's A of every adapter, Kaiming-uniform as PEFT draws it, from a
    generator seeded by ``(seed, round)``: the same in every engine and after a resume."""
    gen = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, round_])
                                            .generate_state(1)[0]))
    out = {}
    for module in adapters(params):
        a = params[f"{module}.lora_A"]
        draw = nn.init.kaiming_uniform_(torch.empty(a.shape), a=math.sqrt(5), generator=gen)
        out[f"{module}.lora_A"] = draw.to(a)
    return out


def folding(part: Stacking, seed: int) -> ServerTransform:
    """The server step: ``W += scaling * B A`` of the cohort's stack, fresh adapters for the
    next round, every other leaf ``x - mean delta`` (FedAvg, weights ``n_k / n``)."""

    def init(params: Params) -> dict:
        return {}

    def update(params: Params, agg: Aggregate, state: dict):
        modules = adapters(params)
        if modules and part.scaling is None:
            raise ValueError("flora: call algorithm.bind_model(model) first (the adapters' "
                             "scaling)")
        new = {k: params[k] - agg.delta[k] for k in params}
        up = agg.uploads.get(NAME, {})
        for module in modules:
            a_stack = up[f"{module}.lora_A"]  # sum_k p_k A_k in slot k
            b_stack = up[f"{module}.lora_B"] * agg.num_sampled  # B_k in slot k
            weight = params[f"{module}.weight"]
            new[f"{module}.weight"] = weight + part.scaling * (b_stack @ a_stack).to(weight)
            new[f"{module}.lora_B"] = torch.zeros_like(params[f"{module}.lora_B"])
        new.update(fresh_a(params, seed, agg.round))
        return new, agg, state

    return ServerTransform("flora", init, update)


def _ranks(ranks: Sequence[int]) -> tuple[int, ...]:
    out = tuple(ranks)
    if not all(isinstance(r, int) and not isinstance(r, bool) and r > 0 for r in out):
        raise ValueError(f"algorithm.ranks: expected positive integers, got {list(out)}")
    return out


@defaults_from("flora")
def flora(
    local_lr: ScheduleLike, ranks: Sequence[int], seed: int, client_optimizer: str,
    weight_decay: ScheduleLike, max_grad_norm: ScheduleLike | None,
) -> Algorithm:
    """FLoRA: stacked LoRA aggregation, exact for heterogeneous ranks (module docstring)."""
    part = Stacking(_ranks(ranks))
    local = chain(masked_adapters(part, "flora_grad"),
                  local_optimizer(client_optimizer, local_lr, weight_decay=weight_decay,
                                  max_grad_norm=max_grad_norm),
                  masked_adapters(part, "flora_step"))
    return Algorithm(
        NAME, local, folding(part, int(seed)), parts=(part,),
        description="FLoRA (Wang et al. 2024): stacked LoRA aggregation, exact for "
                    "heterogeneous ranks; folded into the base each round",
        aggregation="num_samples",  # p_k = n_k / n (official code: normalised sizes)
        sends_model=False,  # the stack and the head travel, not the target weights
    )
