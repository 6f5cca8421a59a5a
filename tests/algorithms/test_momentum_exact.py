"""Exact checks of FedAvg-M and SCAFFOLD-M's wiring (src/fedforge/algorithms/momentum.py)
that the four-round references leave open: the momentum upload of a client that took no
step, β's bounds and message, the parts' names and byte counts (docs/testing.md).
"""

from pathlib import Path

import pytest
import torch

from fedforge.algorithms.fadamgc import GradientTracking
from fedforge.algorithms.momentum import (
    GlobalMomentum,
    fedavg_m,
    mix_global_momentum,
    scaffold_m,
)
from fedforge.client.transforms import RoundContext
from fedforge.protocol.algorithm import FinalizeInputs

F64 = torch.float64


def _fin(delta, steps):
    ctx = RoundContext({}, {"round": torch.tensor(1.0)}, {}, {})
    return FinalizeInputs(ctx, {"w": torch.tensor(delta, dtype=F64)}, {}, {}, None,
                          torch.tensor(float(steps), dtype=F64))


def test_global_momentum_part():
    part = GlobalMomentum(0.5)
    assert part.name == "momentum" and part.uplink_models == 0.0
    assert GlobalMomentum(0.5, name="m2").name == "m2"
    state = part.server_init({"w": torch.ones(2, dtype=F64)})
    assert state["g"]["w"].tolist() == [0.0, 0.0]
    assert part.broadcast({"g": 3, "other": 4}) == {"g": 3}
    # g_i = delta / (η K): 4 steps at η = 0.5 -> / 2; no step -> / (η · 1), not / 0
    new_state, up = part.finalize(_fin([1.0, -2.0], 4))
    assert new_state == {}
    assert up["g"]["w"].tolist() == [0.5, -1.0]
    _, up = part.finalize(_fin([1.0, -2.0], 0))
    assert up["g"]["w"].tolist() == [2.0, -4.0]
    assert part.server_update(state, {"g": {"w": 7}}, None) == {"g": {"w": 7}}


def test_mix_global_momentum_by_hand():
    tx = mix_global_momentum("mom", 0.25)
    assert tx.name == "mix_mom"
    ctx = RoundContext({}, {"mom": {"g": {"w": torch.tensor([4.0, 0.0], dtype=F64)}}}, {}, {})
    state = tx.init({}, ctx)
    assert state == {}
    out, state = tx.update({"w": torch.tensor([8.0, 4.0], dtype=F64)}, state, {}, ctx)
    assert out["w"].tolist() == [0.25 * 8 + 0.75 * 4, 0.25 * 4]
    assert state == {}


@pytest.mark.parametrize("factory", [fedavg_m, scaffold_m])
def test_beta_bounds(factory):
    factory(beta=1.0)  # β = 1: plain FedAvg / SCAFFOLD local steps
    for beta in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match=rf"^algorithm\.beta: expected 0 < beta <= 1, "
                                             rf"got {beta}$"):
            factory(beta=beta)


def test_parts_and_names():
    avg = fedavg_m(local_lr=0.5)
    assert avg.name == "fedavg_global_momentum"
    (mom,) = avg.parts
    assert isinstance(mom, GlobalMomentum) and mom.name == "momentum" and mom.local_lr == 0.5
    scf = scaffold_m(local_lr=0.5)
    assert scf.name == "scaffold_m"
    tracking, mom = scf.parts
    assert isinstance(tracking, GradientTracking) and tracking.name == "scaffold_m"
    assert tracking.mode == "gradient" and tracking.fraction == 1.0
    assert isinstance(mom, GlobalMomentum) and mom.local_lr == 0.5


def test_descriptions_are_the_documented_ones():
    """What ``fedforge algorithms`` prints is the list in docs/algorithms.md."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "algorithms.md").read_text()
    for alg in (fedavg_m(), scaffold_m()):
        assert f"\nsync: {alg.description}\n" in page, alg.name
