"""The personalised methods: each a short composition of a local optimizer and a
:class:`~fedforge.algorithms.personal.base.Personal` spec over FedAvg's server.

References:
  Local-only: every client trains alone (the lower reference of every pFL benchmark).
  FedAvg-FT: FedAvg, then a few local fine-tuning steps per client at evaluation.
  Li, Hu, Beirami & Smith, "Ditto: Fair and Robust Federated Learning Through
  Personalization", ICML 2021.
  Arivazhagan et al., "Federated Learning with Personalization Layers", 2019 (FedPer).
  Collins, Hassani, Mokhtari & Shakkottai, "Exploiting Shared Representations for
  Personalized Federated Learning", ICML 2021 (FedRep).
  Oh, Kim & Yun, "FedBABU: Toward Enhanced Representation for Federated Image
  Classification", ICLR 2022.
  Liang et al., "Think Locally, Act Globally: Federated Learning with Local and Global
  Representations", 2020 (LG-FedAvg).

Every factory takes the SGD-family local-optimizer knobs of FedAvg (``client_optimizer``,
``weight_decay``, ``max_grad_norm``, ``nar``), so Ditto over FedNAR's co-clipped decay or
over local AMSGrad is a config switch, not new code. ``head`` is the model's body/head split
(``[model] head`` sets it; none: the model's last layer).
"""

from __future__ import annotations

from collections.abc import Sequence

from fedforge.algorithms.defaults import defaults_from
from fedforge.algorithms.personal.apfl import apfl
from fedforge.algorithms.personal.base import Personal, PersonalAlgorithm, Phase, personalised
from fedforge.algorithms.personal.fedala import fedala
from fedforge.algorithms.personal.fedbn import fedbn
from fedforge.algorithms.personal.fedproto import fedproto
from fedforge.algorithms.personal.fedrod import fedrod
from fedforge.algorithms.personal.perfedavg import per_fedavg_fo, per_fedavg_hf
from fedforge.algorithms.personal.pfedme import pfedme
from fedforge.algorithms.personal.split import freeze
from fedforge.client.optimizers import local_optimizer
from fedforge.client.transforms import Transform, add_prox, chain
from fedforge.core.schedules import ScheduleLike


def _opt(client_optimizer: str, local_lr: ScheduleLike, weight_decay: ScheduleLike,
         max_grad_norm: ScheduleLike | None, nar: bool) -> Transform:
    return local_optimizer(client_optimizer, local_lr, weight_decay=weight_decay,
                           max_grad_norm=max_grad_norm, nar=nar)


def _head(head: Sequence[str] | None) -> tuple[str, ...] | None:
    return None if head is None else tuple(head)


def _passes(value: int, field: str) -> int:
    if int(value) < 1:
        raise ValueError(f"algorithm.{field}: expected an integer >= 1, got {value}")
    return int(value)


@defaults_from("local_only")
def local_only(local_lr: ScheduleLike, client_optimizer: str, weight_decay: ScheduleLike,
               max_grad_norm: ScheduleLike | None, nar: bool) -> PersonalAlgorithm:
    """Local-only: each client trains its own whole model; nothing is shared."""
    opt = _opt(client_optimizer, local_lr, weight_decay, max_grad_norm, nar)
    return personalised("local_only", opt, Personal(kept="all", finetune=Phase(opt)),
                        "Local-only: every client trains its own model, nothing is averaged")


@defaults_from("fedavg_ft")
def fedavg_ft(local_lr: ScheduleLike, client_optimizer: str, weight_decay: ScheduleLike,
              max_grad_norm: ScheduleLike | None, nar: bool, finetune_steps: int
              ) -> PersonalAlgorithm:
    """FedAvg-FT: FedAvg training; a client's model is the global one after
    ``finetune_steps`` local steps on its own training data (at evaluation only)."""
    opt = _opt(client_optimizer, local_lr, weight_decay, max_grad_norm, nar)
    spec = Personal(finetune=Phase(opt), finetune_steps=int(finetune_steps))
    return personalised("fedavg_ft", opt, spec,
                        "FedAvg-FT: FedAvg, then local fine-tuning steps at evaluation")


@defaults_from("ditto")
def ditto(local_lr: ScheduleLike, lam: float, personal_passes: int, client_optimizer: str,
          weight_decay: ScheduleLike, max_grad_norm: ScheduleLike | None, nar: bool
          ) -> PersonalAlgorithm:
    """Ditto (Li et al. 2021, Alg. 1): the shared model w is trained as in FedAvg; beside it
    the client's own model v_i takes steps on ``f_i(v_i) + lam/2 ||v_i - w^t||^2`` (w^t the
    model the round started from), and only v_i is evaluated."""
    if lam < 0:
        raise ValueError(f"algorithm.lam: expected lam >= 0, got {lam}")
    opt = _opt(client_optimizer, local_lr, weight_decay, max_grad_norm, nar)
    side = Phase(chain(add_prox(lam), opt), _passes(personal_passes, "personal_passes"))
    return personalised("ditto", opt, Personal(side=side, finetune=Phase(opt)),
                        "Ditto (Li et al. 2021): FedAvg + personal models with prox lam to w")


@defaults_from("fedper")
def fedper(local_lr: ScheduleLike, client_optimizer: str, weight_decay: ScheduleLike,
           max_grad_norm: ScheduleLike | None, nar: bool, head: Sequence[str] | None
           ) -> PersonalAlgorithm:
    """FedPer (Arivazhagan et al. 2019): the head is the client's own, the body is averaged;
    every local step trains both."""
    opt = _opt(client_optimizer, local_lr, weight_decay, max_grad_norm, nar)
    spec = Personal(kept="head", head=_head(head), finetune=Phase(opt), finetune_part="head")
    return personalised("fedper", opt, spec,
                        "FedPer (Arivazhagan et al. 2019): personal head, averaged body")


@defaults_from("fedrep")
def fedrep(local_lr: ScheduleLike, head_passes: int, client_optimizer: str,
           weight_decay: ScheduleLike, max_grad_norm: ScheduleLike | None, nar: bool,
           head: Sequence[str] | None) -> PersonalAlgorithm:
    """FedRep (Collins et al. 2021, Alg. 1): ``head_passes`` passes over the round's batches
    train the client's own head with the body fixed, then the round's steps train the body
    with that head fixed; only the body is averaged."""
    opt = _opt(client_optimizer, local_lr, weight_decay, max_grad_norm, nar)
    patterns = _head(head)
    first = Phase(chain(opt, freeze("body", patterns)), _passes(head_passes, "head_passes"))
    spec = Personal(kept="head", head=patterns, first=first, finetune=Phase(opt),
                    finetune_part="head")
    return personalised("fedrep", chain(opt, freeze("head", patterns)), spec,
                        "FedRep (Collins et al. 2021): head epochs, then body epochs; "
                        "personal head")


@defaults_from("fedbabu")
def fedbabu(local_lr: ScheduleLike, finetune_steps: int, finetune_lr: ScheduleLike | None,
            finetune_part: str, client_optimizer: str, weight_decay: ScheduleLike,
            max_grad_norm: ScheduleLike | None, nar: bool, head: Sequence[str] | None
            ) -> PersonalAlgorithm:
    """FedBABU (Oh et al. 2022): the body is trained and averaged with the randomly
    initialised head frozen; at evaluation each client fine-tunes ``finetune_part`` for
    ``finetune_steps`` steps at ``finetune_lr`` (default: ``local_lr``; the authors' code
    fine-tunes at a rate far below the training one)."""
    opt = _opt(client_optimizer, local_lr, weight_decay, max_grad_norm, nar)
    ft_opt = opt if finetune_lr is None else _opt(client_optimizer, finetune_lr, weight_decay,
                                                  max_grad_norm, nar)
    patterns = _head(head)
    spec = Personal(head=patterns, finetune=Phase(ft_opt), finetune_part=finetune_part,
                    finetune_steps=int(finetune_steps))
    return personalised("fedbabu", chain(opt, freeze("head", patterns)), spec,
                        "FedBABU (Oh et al. 2022): body only, frozen random head; "
                        "fine-tuned at evaluation")


@defaults_from("lg_fedavg")
def lg_fedavg(local_lr: ScheduleLike, client_optimizer: str, weight_decay: ScheduleLike,
              max_grad_norm: ScheduleLike | None, nar: bool, head: Sequence[str] | None
              ) -> PersonalAlgorithm:
    """LG-FedAvg (Liang et al. 2020): the body (local representation) is the client's own,
    the head is averaged; every local step trains both."""
    opt = _opt(client_optimizer, local_lr, weight_decay, max_grad_norm, nar)
    spec = Personal(kept="body", head=_head(head), finetune=Phase(opt), finetune_part="body")
    return personalised("lg_fedavg", opt, spec,
                        "LG-FedAvg (Liang et al. 2020): personal body, averaged head")


PERSONAL_ALGORITHMS = {
    "local_only": local_only,
    "fedavg_ft": fedavg_ft,
    "ditto": ditto,
    "fedper": fedper,
    "fedrep": fedrep,
    "fedbabu": fedbabu,
    "lg_fedavg": lg_fedavg,
    "apfl": apfl,
    "pfedme": pfedme,
    "per_fedavg_fo": per_fedavg_fo,
    "per_fedavg_hf": per_fedavg_hf,
    "fedrod": fedrod,
    "fedala": fedala,
    "fedbn": fedbn,
    "fedproto": fedproto,
}
"""The personalised methods, by registry name (``fedforge.algorithms`` registers them)."""
