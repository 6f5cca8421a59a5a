"""Exact checks of the uplink diagnostics part (src/fedforge/algorithms/uplink_diagnostics.py)
beyond the hand-computed metrics of tests/comm/test_sketch_diagnostics.py: what a client
uploads, and a server state whose keys and dtypes stay those of ``server_init``
(docs/testing.md).
"""

import torch

from fedforge.algorithms.uplink_diagnostics import UplinkDiagnostics
from fedforge.client.transforms import RoundContext
from fedforge.protocol.algorithm import FinalizeInputs
from fedforge.server.chain import Aggregate

F32, F64 = torch.float32, torch.float64


def test_client_uploads_its_flat_delta():
    delta = {"a": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "b": torch.tensor([5.0])}
    ctx = RoundContext(delta, {}, {}, {})
    fin = FinalizeInputs(ctx, delta, delta, {}, None, torch.tensor(1.0))
    state, uploads = UplinkDiagnostics(2).finalize(fin)
    assert state == {} and list(uploads) == ["delta"]
    assert uploads["delta"].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]


def test_server_state_keeps_its_layout_and_dtypes():
    """A float32 model whose decoded update arrives in float64 and true mean delta in float32:
    the error is computed in the true delta's dtype and the window stays float32."""
    part = UplinkDiagnostics(2)
    state = part.server_init({"w": torch.zeros(2)})
    assert list(state) == ["window", "filled", "err", "err_sum"]
    assert state["window"].dtype == F32 and state["window"].shape == (2, 2)
    agg = Aggregate({"w": torch.tensor([3.0, 0.0], dtype=F64)}, {}, 2, 2, 1)
    new = part.server_update(state, {"delta": torch.tensor([3.0, 4.0])}, agg)
    assert list(new) == list(state)
    assert new["err"].dtype == F32 and new["err"].item() == torch.tensor(0.8).item()
    assert new["window"].dtype == F32 and new["window"].tolist() == [[0.0, 0.0], [3.0, 4.0]]
    wide = part.server_update(state, {"delta": torch.tensor([3.0, 4.0], dtype=F64)}, agg)
    assert wide["window"].dtype == F32  # a float64 true delta is stored in the window's dtype
