"""Shared by the factory mutation tests: what a server optimizer does on fixed deltas, and
the iterates of a local optimizer on fixed gradients."""

from __future__ import annotations

import torch

F64 = torch.float64
X0 = torch.tensor([3.0, -4.0], dtype=F64)
DELTAS = [[0.2, -0.1], [0.05, 0.3], [-0.4, 0.0]]
GRADS = [[1.0, 2.0], [0.0, 0.0], [-3.0, 0.5]]


def server_path(opt) -> torch.Tensor:
    """Updates a server optimizer returns for DELTAS, starting from X0."""
    params = {"w": X0.clone()}
    state, out = opt.init(params), []
    for d in DELTAS:
        upd, state = opt.update({"w": torch.tensor(d, dtype=F64)}, state, params)
        params = {"w": params["w"] + upd["w"]}
        out.append(upd["w"])
    return torch.stack(out)


def same(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)


def local_path(tx, ctx=None, grads=GRADS) -> torch.Tensor:
    """Iterates of a local optimizer from X0 on ``grads`` (``ctx``: a round-1 context with
    no state when not given)."""
    from fedforge.client.transforms import RoundContext  # noqa: PLC0415

    x = {"w": X0.clone()}
    ctx = ctx or RoundContext(x, {"round": torch.tensor(1.0, dtype=F64)}, {}, {})
    state, out = tx.init(x, ctx), []
    for g in grads:
        upd, state = tx.update({"w": torch.tensor(g, dtype=F64)}, state, x, ctx)
        x = {"w": x["w"] + upd["w"]}
        out.append(x["w"])
    return torch.stack(out)
