"""Uplink diagnostics for compressed algorithms (SAFL, FetchSGD, top-k + EF, MARINA).

Enabled with the algorithm's ``diagnostics_window = W`` (0: off). In simulation the server can
know the true mean delta Δ, so this part has every client upload its flat delta (a diagnostic
channel: not counted in ``bytes_up``) and, after the server step, compares it with the update
``u`` the codec decoded. At each evaluation it logs

* ``desketch_rel_err``: ``||u - Δ|| / ||Δ||`` of the last round (``_mean``: over all rounds);
* ``delta_energy_top1`` / ``delta_energy_top5``: the share of the squared Frobenius norm of
  the last W true Δ's (stacked ``[W, d]``) in their top 1 / 5 singular directions — close to
  1 when updates live in a low-dimensional subspace, the regime SAFL's analysis relies on.

The deltas are averaged uniformly, as the compressed algorithms aggregate them.
"""

from __future__ import annotations

import torch

from fedforge.comm.codec import flatten, zeros_flat
from fedforge.comm.sketch import relative_error, topk_energy
from fedforge.core.tree import Params
from fedforge.protocol.algorithm import FinalizeInputs, Part
from fedforge.server.chain import Aggregate

ENERGY_KS = (1, 5)


class UplinkDiagnostics(Part):
    """Relative decode error and top-k energy of the true mean deltas (see module doc)."""

    name = "uplink_diag"

    def __init__(self, window: int) -> None:
        if int(window) < 1:
            raise ValueError(f"algorithm.diagnostics_window: expected an int >= 1, got "
                             f"{window!r}")
        self.window = int(window)

    def server_init(self, params: Params) -> dict:
        flat = zeros_flat(params)
        zero = flat.new_zeros(())
        return {"window": flat.new_zeros((self.window, flat.numel())), "filled": zero,
                "err": zero, "err_sum": zero}

    def finalize(self, fin: FinalizeInputs) -> tuple[dict, dict]:
        return {}, {"delta": flatten(fin.delta)}

    def server_update(self, server_state: dict, mean_uploads: dict, agg: Aggregate) -> dict:
        true = mean_uploads["delta"]
        err = relative_error(flatten(agg.delta).to(true.dtype), true)
        window = torch.cat([server_state["window"][1:], true[None].to(
            server_state["window"].dtype)])
        return {"window": window, "filled": server_state["filled"] + 1, "err": err,
                "err_sum": server_state["err_sum"] + err}

    def server_metrics(self, server_state: dict, client_states: dict) -> dict:
        filled = int(server_state["filled"])
        if filled == 0:
            return {}
        rows = server_state["window"][-min(filled, self.window):]
        energy = topk_energy(rows, ENERGY_KS)
        return {"desketch_rel_err": server_state["err"],
                "desketch_rel_err_mean": server_state["err_sum"] / filled,
                **{f"delta_energy_top{k}": e for k, e in zip(ENERGY_KS, energy, strict=True)}}
