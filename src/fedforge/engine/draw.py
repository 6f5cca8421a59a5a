"""What a synchronous round is given and what it gives back, as typed records.

:class:`RoundDraw` is one round's cohort and everything drawn with it; the runner's
``sample_round`` makes one, the straggler clock narrows it with :meth:`RoundDraw.keep`, and
:func:`~fedforge.engine.round.federated_round` runs it. :class:`CohortMetrics` is what the
cohort reports per client; only the metrics writer turns it into string keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace

import torch
from torch.utils import _pytree as pytree

from fedforge.engine.randomness import client_keys


@dataclass(frozen=True)
class RoundDraw:
    """Round ``round``'s cohort: who trains, on which samples, and with which weights.

    Every tensor field is per client (leading axis ``[C]``), so narrowing the cohort is one
    index per field (:meth:`keep`).
    """

    client_ids: torch.Tensor  # [C]
    sample_idx: torch.Tensor  # [C, steps, batch] indices into the training set
    weights: torch.Tensor  # [C, steps, batch] sample mask, 0 = padding
    agg_weights: torch.Tensor | None = None  # [C] weights of the deltas; None: uniform 1/C
    info: dict | None = field(default_factory=dict)  # per-client round inputs [C]; None: {}
    counts: torch.Tensor | None = None  # [C] training-sample counts n_i (num_samples uploads)
    keys: torch.Tensor | None = None  # [C] dropout keys; None: those of seed 0 (with_keys)
    round: int = 1  # the round index t, 1-based; broadcast for schedules

    def __post_init__(self) -> None:
        if self.info is None:  # "no per-client inputs", as algorithm.round_info may say
            object.__setattr__(self, "info", {})

    @property
    def size(self) -> int:
        return int(self.client_ids.numel())

    def with_keys(self, seed: int) -> RoundDraw:
        """This draw with the clients' dropout keys of ``(seed, round, client id)``."""
        keys = client_keys(seed, self.round, self.client_ids).to(self.sample_idx.device)
        return replace(self, keys=keys)

    def keep(self, positions: Sequence[int] | torch.Tensor) -> RoundDraw:
        """The clients at ``positions`` only (stragglers dropped); their aggregation weights
        sum to one again."""
        k = torch.as_tensor(positions, dtype=torch.long)

        def take(v: torch.Tensor | None) -> torch.Tensor | None:
            return None if v is None else v[k.to(v.device)]

        agg = take(self.agg_weights)
        return replace(
            self, client_ids=take(self.client_ids), sample_idx=take(self.sample_idx),
            weights=take(self.weights), info={name: take(v) for name, v in self.info.items()},
            agg_weights=None if agg is None else agg / agg.sum().clamp_min(1e-30),
            counts=take(self.counts), keys=take(self.keys))


@dataclass(frozen=True)
class CohortMetrics:
    """Per-client metrics of one cohort round, each ``[C]`` unless noted.

    A pytree (its tensors are leaves), so the engines stack and concatenate it like the
    clients' states; optional fields are ``None`` where nothing reported them.
    """

    loss: torch.Tensor  # mean training loss over the steps taken
    steps: torch.Tensor  # steps really taken (padding steps excluded)
    parts: dict = field(default_factory=dict)  # the parts' diagnostics, logged as means
    prep_s: torch.Tensor | None = None  # wall seconds of per-client preparation (FedPTR)
    prep_samples: torch.Tensor | None = None  # samples that preparation processed
    server_prep_s: torch.Tensor | None = None  # 0-d: the server's preparation seconds
    server_prep_samples: torch.Tensor | None = None  # 0-d: samples it processed
    skipped_clients: torch.Tensor | None = None  # ids screened out (divergence skip_client)
    attackers: torch.Tensor | None = None  # 1.0 where the client's update was an attack
    robust: dict = field(default_factory=dict)  # the robust aggregator's per-client report

    @classmethod
    def empty(cls, like: torch.Tensor) -> CohortMetrics:
        """The metrics of a cohort of no clients, in ``like``'s dtype and device."""
        none = like.new_zeros(0)
        return cls(none, none)

    def as_dict(self) -> dict:
        """The reported fields under their names, for writers that need string keys: the
        parts' diagnostics nested under ``"parts"``, the robust aggregator's prefixed
        ``robust_``; fields nobody reported are left out."""
        out = {f.name: getattr(self, f.name) for f in fields(self)
               if f.name not in ("parts", "robust") and getattr(self, f.name) is not None}
        if self.parts:
            out["parts"] = self.parts
        return {**out, **{f"robust_{k}": v for k, v in self.robust.items()}}

pytree.register_dataclass(CohortMetrics)
