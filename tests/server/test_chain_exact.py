"""Exact checks of the server chain (src/fedforge/server/chain.py) with stages that record
what they see: stage order and names, the state mapping, evaluation points, checkpoint
restore, the codec/optimizer/parts stages and the population mean (docs/testing.md).
"""

import pytest
import torch

from fedforge.protocol.algorithm import Part
from fedforge.server.chain import (
    Aggregate,
    ServerChain,
    ServerState,
    ServerTransform,
    decode_stage,
    optimizer_stage,
    parts_stage,
    population_mean_step,
)

F64 = torch.float64


def _w(*values):
    return {"w": torch.tensor(values, dtype=F64)}


def _agg(delta, uploads=None, s=2, n=8, t=3):
    return Aggregate(delta, uploads or {}, s, n, t)


def _adder(name, amount, log):
    """Adds ``amount`` to the params and counts its own steps in its state."""

    def update(params, agg, state):
        log.append((name, params["w"].tolist(), agg.round))
        return ({"w": params["w"] + amount}, agg._replace(round=agg.round + 10),
                {"n": state["n"] + 1})

    return ServerTransform(name, lambda params: {"n": torch.zeros((), dtype=F64)}, update)


def test_stages_run_in_order_each_with_its_own_state():
    log = []
    chain = ServerChain((_adder("a", 1.0, log), _adder("b", 10.0, log)))
    state = chain.init(_w(0.0))
    assert isinstance(state, ServerState) and list(state) == ["a", "b"] and len(state) == 2
    assert state["a"]["n"].item() == 0.0 and state.tree() == dict(state.stages)
    params, state = chain.step(_w(0.0), state, _agg(_w(0.0)))
    params, state = chain.step(params, state, _agg(_w(0.0)))
    assert params["w"].tolist() == [22.0]
    # b sees a's params and a's modified aggregate (round + 10)
    assert log == [("a", [0.0], 3), ("b", [1.0], 13), ("a", [11.0], 3), ("b", [12.0], 13)]
    assert [state[k]["n"].item() for k in state] == [2.0, 2.0]
    assert list(state.tree()) == ["a", "b"]


def test_duplicate_stage_names_are_refused():
    log = []
    with pytest.raises(ValueError, match=r"^server chain: duplicate stage names \['a', 'a'\]$"):
        ServerChain((_adder("a", 1.0, log), _adder("a", 2.0, log)))
    ServerChain((_adder("a", 1.0, log), _adder("b", 2.0, log)))  # distinct names are fine


def test_eval_params_applies_every_stage_that_has_one():
    log = []
    plain = _adder("plain", 1.0, log)
    assert plain.eval_params is None
    half = ServerTransform("half", lambda p: {"k": torch.tensor(2.0, dtype=F64)},
                           lambda p, a, s: (p, a, s),
                           lambda p, s: {"w": p["w"] / s["k"]})
    chain = ServerChain((plain, half, ServerTransform("third", lambda p: {},
                                                      lambda p, a, s: (p, a, s),
                                                      lambda p, s: {"w": p["w"] - 1.0})))
    state = chain.init(_w(8.0))
    assert chain.eval_params(_w(8.0), state)["w"].tolist() == [3.0]
    assert ServerChain((plain,)).eval_params(_w(8.0), ServerChain((plain,)).init(_w(8.0)))[
        "w"].tolist() == [8.0]


def test_restore_reads_a_checkpoint_tree_in_init_order_and_names_the_server():
    log = []
    chain = ServerChain((_adder("a", 1.0, log), _adder("b", 1.0, log)))
    loaded = {"b": {"n": torch.tensor(5.0)}, "a": {"n": torch.tensor(4.0)}}
    state = chain.restore(_w(0.0), loaded)
    assert isinstance(state, ServerState) and list(state) == ["a", "b"]
    assert state["a"]["n"].dtype == F64 and state["b"]["n"].item() == 5.0
    with pytest.raises(ValueError, match=r"^checkpoint server state does not match"):
        chain.restore(_w(0.0), {"a": {"n": torch.tensor(4.0)}})


class _Codec:
    def server_init(self, params):
        return {"calls": 0}

    def decode(self, message, state, params, round_):
        return ({"w": message["w"] * 2 + params["w"] * 0 + round_},
                {"calls": state["calls"] + 1})


def test_decode_stage_replaces_the_delta_with_the_decoded_mean():
    stage = decode_stage(_Codec())
    assert stage.name == "decode" and stage.init(_w(0.0)) == {"calls": 0}
    params, agg, state = stage.update(_w(5.0), _agg(_w(1.5), t=4), {"calls": 1})
    assert params["w"].tolist() == [5.0]
    assert agg.delta["w"].tolist() == [7.0]  # 2·1.5 + round 4
    assert agg.round == 4 and agg.num_sampled == 2 and state == {"calls": 2}


class _Opt:
    def init(self, params):
        return {"t": 0}

    def update(self, delta, state, params):
        return {"w": -delta["w"] * 0.5}, {"t": state["t"] + 1}


def test_optimizer_stage_adds_the_update():
    stage = optimizer_stage(_Opt())
    assert stage.name == "opt" and stage.init(_w(0.0)) == {"t": 0}
    params, agg, state = stage.update(_w(5.0), _agg(_w(2.0)), {"t": 3})
    assert params["w"].tolist() == [4.0] and state == {"t": 4}
    assert agg.delta["w"].tolist() == [2.0]


class _Counter(Part):
    """Server state: the sum of its uploads' ``x``; adjusts the model by ``+ scale · sum``."""

    def __init__(self, name, scale):
        self.name, self.scale = name, scale

    def server_init(self, params):
        return {"sum": torch.zeros((), dtype=F64)}

    def server_update(self, server_state, mean_uploads, agg):
        return {"sum": server_state["sum"] + mean_uploads.get("x", 100.0)}

    def adjust_params(self, params, server_state):
        return {"w": params["w"] * self.scale + server_state["sum"]}


def test_parts_stage_updates_every_part_then_adjusts_in_order():
    stage = parts_stage((_Counter("p", 2.0), _Counter("q", 10.0)))
    assert stage.name == "parts"
    state = stage.init(_w(0.0))
    assert list(state) == ["p", "q"] and state["p"]["sum"].item() == 0.0
    uploads = {"p": {"x": torch.tensor(1.0, dtype=F64)}}  # q uploads nothing: sees {}
    params, agg, state = stage.update(_w(3.0), _agg(_w(0.0), uploads), state)
    assert state["p"]["sum"].item() == 1.0 and state["q"]["sum"].item() == 100.0
    assert params["w"].tolist() == [(3.0 * 2 + 1.0) * 10 + 100.0]
    assert agg.uploads is uploads


def test_population_mean_step():
    """total + scale (S/N) mean: S = 2 of N = 8 clients changed by a mean of (4, -8)."""
    total, change = _w(1.0, 1.0), _w(4.0, -8.0)
    agg = _agg(_w(0.0), s=2, n=8)
    assert population_mean_step(total, change, agg)["w"].tolist() == [2.0, -1.0]
    assert population_mean_step(total, change, agg, scale=-0.5)["w"].tolist() == [0.5, 2.0]


def test_restore_and_optimizer_stage_see_the_params():
    """A stage state shaped like the model; an optimizer whose update reads the model."""
    shaped = ServerTransform("m", lambda params: {"m": torch.zeros_like(params["w"])},
                             lambda p, a, s: (p, a, s))
    state = ServerChain((shaped,)).restore(_w(1.0, 2.0), {"m": {"m": torch.ones(2)}})
    assert state["m"]["m"].dtype == F64 and state["m"]["m"].tolist() == [1.0, 1.0]

    class Decay:
        def init(self, params):
            return {}

        def update(self, delta, state, params):
            return {"w": -delta["w"] - 0.5 * params["w"]}, state

    params, _, _ = optimizer_stage(Decay()).update(_w(2.0, 4.0), _agg(_w(1.0, 1.0)), {})
    assert params["w"].tolist() == [0.0, 1.0]  # 2 - 1 - 1, 4 - 1 - 2
