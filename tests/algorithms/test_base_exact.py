"""Exact checks of what an algorithm composes (src/fedforge/protocol/algorithm.py), with parts
that record what they are given: the needs a driver must serve and the one-line refusal, how
parts' states, uploads, metrics and round inputs are merged, the preparation hooks, the server
chain it builds and the message sizes (docs/testing.md).
"""

import pytest
import torch

from fedforge.client.optimizers import local_optimizer
from fedforge.client.transforms import RoundContext
from fedforge.comm.codec import Codec, CompressCodec, MarinaCodec
from fedforge.protocol.algorithm import (
    NEEDS,
    UPLOAD_SCALE,
    Algorithm,
    FinalizeInputs,
    Part,
    PrepareInputs,
    check_support,
)
from fedforge.server.chain import Aggregate, ServerState, ServerTransform
from fedforge.server.optimizers import server_sgd

F64 = torch.float64
PARAMS = {"w": torch.zeros(3, dtype=F64), "b": torch.zeros(2, dtype=torch.float32)}
SGD = local_optimizer("sgd", 0.1)


class Plain(Part):
    """The defaults of Part, only renamed."""

    def __init__(self, name="plain"):
        self.name = name


class Stateful(Part):
    def __init__(self, name="s", upload_weights="uniform", uplink=0.0):
        self.name, self.upload_weights, self.uplink_models = name, upload_weights, uplink

    def client_init(self, params):
        return {"c": torch.ones(2, dtype=F64)}

    def server_init(self, params):
        return {"z": torch.full((2,), 3.0, dtype=F64)}

    def broadcast(self, server_state):
        return {"z": server_state["z"]}

    def finalize(self, fin):
        c = fin.ctx.client_state.get(self.name, {"c": torch.zeros(2, dtype=F64)})["c"]
        return {"c": c + 1}, {"u": torch.tensor([2.0, 4.0])}

    def client_metrics(self, fin):
        return {f"{self.name}_m": torch.tensor(1.5)}

    def server_metrics(self, server_state, client_states):
        return {f"{self.name}_seen": torch.tensor(float(len(client_states)))}

    def round_info(self, num_sampled, generator):
        return {f"{self.name}_mask": torch.ones(num_sampled, dtype=torch.bool)}


class Preparing(Part):
    prepares = True

    def __init__(self, name="prep"):
        self.name, self.seen, self.states_seen, self.server_seen = name, [], [], []
        self.evaluate = None

    def client_init(self, params):
        return {"k": torch.zeros(())}

    def bind_data(self, input_shape, num_classes):
        self.seen.append((input_shape, num_classes))

    def bind_eval(self, evaluate):
        self.evaluate = evaluate

    def prepare_cohort(self, prep):
        self.seen.append(sorted(prep.info))
        self.states_seen.append(dict(prep.client_states))
        k = prep.client_states.get(self.name, {"k": torch.tensor(0.0)})["k"]
        return ({"k": k + 1}, {f"extra_{self.name}": torch.tensor([7.0])},
                {"prep_s": torch.tensor([0.5])})

    def server_prepare(self, params, server_state, loss_fn):
        self.server_seen.append((params, loss_fn))
        return {"sp": 1}, {"server_prep_s": torch.tensor(0.25)}


class Drawing(Part):
    """Round inputs drawn from the generator it is given."""

    name = "draw"

    def round_info(self, num_sampled, generator):
        return {"draw": torch.rand(num_sampled, generator=generator)}


def _alg(parts=(), codec=None, opt=None, **kw):
    return Algorithm("toy", SGD, opt or server_sgd(1.0), parts=parts, codec=codec, **kw)


def _ctx(client_state, info=None):
    return RoundContext(PARAMS, {"round": torch.tensor(1.0)}, client_state, info or {})


def _fin(client_state, info=None):
    return FinalizeInputs(_ctx(client_state, info), PARAMS, PARAMS, {}, None,
                          torch.tensor(1.0))


def test_part_defaults_are_stateless():
    p = Plain()
    assert Part.name == "part" and Part.upload_weights == "uniform"
    assert p.client_init(PARAMS) == {} and p.server_init(PARAMS) == {}
    assert p.broadcast({"x": 1}) == {}
    assert p.finalize(_fin({"plain": {"q": 1}})) == ({"q": 1}, {})
    assert p.finalize(_fin({})) == ({}, {})
    assert p.client_metrics(_fin({})) == {} and p.server_metrics({}, {}) == {}
    assert p.server_update({"s": 2}, {}, None) == {"s": 2}
    assert p.round_info(3, torch.Generator()) == {}
    assert not p.needs_grad_sum and not p.prepares
    assert p.bind_data((1,), 2) is None
    prep = PrepareInputs(PARAMS, {}, {"plain": {"k": 1}}, {}, None, None, None, None, None)
    assert p.prepare_cohort(prep) == ({"k": 1}, {}, {})
    assert p.prepare_cohort(prep._replace(client_states={})) == ({}, {}, {})
    assert p.server_prepare(PARAMS, {"a": 1}, None) == ({"a": 1}, {})
    assert p.adjust_params(PARAMS, {}) is PARAMS


def test_needs_of_each_kind():
    assert _alg().needs(PARAMS) == frozenset()
    assert _alg((Plain(),)).needs(PARAMS) == frozenset()
    assert _alg((Stateful(),)).needs(PARAMS) == {"client_state", "uploads", "round_info"}
    assert _alg((Stateful(upload_weights="num_samples"),)).needs(PARAMS) == {
        "client_state", "uploads", "round_info", "weighted_uploads"}
    assert _alg((Preparing(),)).needs(PARAMS) == {"client_state", "prepare"}
    assert _alg(codec=Codec()).needs(PARAMS) == {"codec"}
    ef = CompressCodec("topk", k=1, error_feedback=True)
    assert _alg(codec=ef).needs(PARAMS) == {"codec", "client_state"}
    qsgd = CompressCodec("qsgd")
    assert _alg(codec=qsgd).needs(PARAMS) == {"codec", "round_info"}
    assert _alg(requires=frozenset({"full_participation"})).needs(PARAMS) == {
        "full_participation"}
    assert set(NEEDS) == {"client_state", "uploads", "codec", "prepare", "round_info",
                          "full_participation", "weighted_uploads", "privacy", "client_ids",
                          "model"}


def test_privacy_is_a_declared_need():
    """A private algorithm carries its mechanism in the typed ``privacy`` field (nothing
    probes for it) and needs a driver that serves it; the asynchronous driver does not."""
    from dataclasses import replace

    from fedforge.schedulers.serves import ASYNC_SERVES

    alg = _alg((Plain(),))
    assert alg.privacy is None and "privacy" not in alg.needs(PARAMS)
    private = replace(alg, privacy=object())  # any mechanism: needs asks only whether one is set
    assert private.needs(PARAMS) == {"privacy"}
    check_support(private, PARAMS, "f", "d", frozenset({"privacy"}))
    with pytest.raises(ValueError, match=(
            r"^method: 'toy' needs clipped and noised updates with a privacy ledger "
            r"\(differential privacy\), which the fedbuff asynchronous driver cannot serve")):
        check_support(private, PARAMS, "method", "fedbuff asynchronous driver", ASYNC_SERVES)


def test_check_support_names_field_algorithm_driver_and_needs():
    alg = _alg((Stateful(),))
    check_support(alg, PARAMS, "f", "d", frozenset({"client_state", "uploads", "round_info"}))
    with pytest.raises(ValueError, match=(
            r"^run\.driver: 'toy' needs per-client state kept between rounds, per-client random "
            r"inputs drawn each round, which the async driver cannot serve; choose another "
            r"method or algorithm$")):
        check_support(alg, PARAMS, "run.driver", "async driver", frozenset({"uploads"}))


def test_weights_uploads_and_bad_setting():
    assert not _alg((Stateful(),)).weights_uploads
    assert _alg((Plain(), Stateful(upload_weights="num_samples"))).weights_uploads
    with pytest.raises(ValueError, match=r"^part 's': upload_weights must be 'uniform' or "
                                         r"'num_samples', got 'n_i'$"):
        assert _alg((Stateful(upload_weights="n_i"),)).weights_uploads


def test_client_init_keeps_non_empty_states_and_the_codec():
    alg = _alg((Plain(), Stateful()), codec=CompressCodec("topk", k=1, error_feedback=True))
    init = alg.client_init(PARAMS)
    assert list(init) == ["s", "codec"]
    assert init["s"]["c"].tolist() == [1.0, 1.0] and init["codec"]["residual"].shape == (5,)
    assert list(_alg((Stateful(),), codec=Codec()).client_init(PARAMS)) == ["s"]


def test_finalize_merges_states_and_scales_weighted_uploads():
    parts = (Plain(), Stateful("a"), Stateful("b", upload_weights="num_samples"))
    alg = _alg(parts)
    state = {"a": {"c": torch.zeros(2, dtype=F64)}, "b": {"c": torch.ones(2, dtype=F64)}}
    states, uploads = alg.finalize(_fin(state, {UPLOAD_SCALE: torch.tensor(0.5, dtype=F64)}))
    assert list(states) == ["a", "b"]  # plain has no stored state
    assert states["a"]["c"].tolist() == [1.0, 1.0] and states["b"]["c"].tolist() == [2.0, 2.0]
    assert list(uploads) == ["a", "b"]
    assert uploads["a"]["u"].tolist() == [2.0, 4.0]
    assert uploads["b"]["u"].tolist() == [1.0, 2.0]  # times n_i S / n = 0.5
    assert uploads["b"]["u"].dtype == torch.float32
    states, _ = alg.finalize(_fin({"a": state["a"]}, {UPLOAD_SCALE: torch.tensor(0.5)}))
    assert list(states) == ["a"]  # b not in this client's stored state


def test_metrics_and_round_info_merge_every_part():
    alg = _alg((Stateful("a"), Plain(), Stateful("b")), codec=CompressCodec("qsgd"))
    assert alg.client_metrics(_fin({})) == {"a_m": torch.tensor(1.5), "b_m": torch.tensor(1.5)}
    server = alg.server_init(PARAMS)
    m = alg.server_metrics(server, {"a": {"x": 1, "y": 2}})
    assert m == {"a_seen": 2.0, "b_seen": 0.0} and isinstance(m["a_seen"], float)
    info = alg.round_info(3, torch.Generator().manual_seed(0))
    assert list(info) == ["a_mask", "b_mask", "codec_key"]
    assert info["a_mask"].shape == (3,) and info["codec_key"].shape == (3,)
    assert _alg((Plain(),)).round_info(3, torch.Generator()) == {}


def test_bind_data_and_preparation_hooks():
    prep_part, plain = Preparing(), Plain()
    alg = _alg((plain, Stateful("s"), prep_part))
    assert alg.prepares and not _alg((Stateful(),)).prepares
    alg.bind_data([1, 28, 28], 10)
    assert prep_part.seen == [((1, 28, 28), 10)]  # the shape as a tuple
    states = {"s": {"c": 1}, "prep": {"k": torch.tensor(2.0)}}
    prep = PrepareInputs(PARAMS, {}, states, {"given": 1}, None, None, None, None, None)
    new_states, info, metrics = alg.prepare_cohort(prep)
    assert new_states["prep"]["k"].item() == 3.0 and new_states["s"] == {"c": 1}
    assert list(new_states) == ["s", "prep"] and states["prep"]["k"].item() == 2.0
    assert set(info) == {"given", "extra_prep"} and prep_part.seen[-1] == ["given"]
    assert set(metrics) == {"prep_s"}
    # a preparing part without stored state does not add one
    new_states, _, _ = alg.prepare_cohort(prep._replace(client_states={"s": {"c": 1}}))
    assert list(new_states) == ["s"]
    server = alg.server_init(PARAMS)
    new_server, metrics = alg.server_prepare(PARAMS, server, None)
    assert isinstance(new_server, ServerState) and list(new_server) == list(server)
    assert new_server["parts"]["prep"] == {"sp": 1}
    assert new_server["parts"]["s"] is server["parts"]["s"]
    assert set(metrics) == {"server_prep_s"}
    untouched, metrics = _alg((Stateful(),)).server_prepare(PARAMS, server, None)
    assert untouched["parts"] == server["parts"] and metrics == {}


def test_server_chain_and_broadcast():
    alg = _alg((Stateful("a"), Plain()))
    assert [s.name for s in alg.server.stages] == ["opt", "parts"]
    assert alg.server is alg.server  # built once
    coded = _alg(codec=Codec())
    assert [s.name for s in coded.server.stages] == ["decode", "opt", "parts"]
    custom = ServerTransform("opt", lambda p: {"t": 0}, lambda p, a, s: (p, a, s),
                             lambda p, s: {"w": p["w"] + 1})
    extra = _alg(opt=custom)
    assert extra.server.stages[0] is custom
    state = alg.server_init(PARAMS)
    assert list(state) == ["opt", "parts"] and state["parts"]["a"]["z"].tolist() == [3.0, 3.0]
    assert alg.broadcast(state) == {"a": {"z": state["parts"]["a"]["z"]}, "plain": {}}
    agg = Aggregate({k: torch.ones_like(v) for k, v in PARAMS.items()}, {"a": {"u": 1}}, 1, 4, 1)
    new, _ = alg.server_step(PARAMS, state, agg)
    assert new["w"].tolist() == [-1.0, -1.0, -1.0]
    assert alg.eval_params(PARAMS, state) is PARAMS
    assert extra.eval_params(PARAMS, extra.server_init(PARAMS))["w"].tolist() == [1.0] * 3


def test_message_nbytes():
    """Model: 3 float64 + 2 float32 = 32 bytes; broadcast a's z: 16 bytes."""
    alg = _alg((Stateful("a", uplink=0.5), Plain()))
    state = alg.server_init(PARAMS)
    assert alg.message_nbytes(PARAMS, state) == (32 + 16, 48)  # up: 32 · (1 + 0.5)
    assert _alg().message_nbytes(PARAMS, _alg().server_init(PARAMS)) == (32, 32)
    coded = _alg((Stateful("a", uplink=0.5),), codec=CompressCodec("topk", k=2))
    st = coded.server_init(PARAMS)
    assert coded.message_nbytes(PARAMS, st, 3) == (48, 2 * 8 + 16)
    assert Algorithm("x", SGD, server_sgd()).aggregation == "uniform"
    assert Algorithm("x", SGD, server_sgd()).hparams == {}
    assert Algorithm("x", SGD, server_sgd()).description == ""
    assert not _alg((Stateful(),)).needs_grad_sum


class Sized(Part):
    """Keeps per-client state only for a non-empty model."""

    name = "sized"

    def client_init(self, params):
        return {"c": torch.zeros(len(params))} if params else {}


class ScalarUpload(Part):
    name, upload_weights = "n", "num_samples"

    def finalize(self, fin):
        return {}, {"count": torch.tensor(3.0)}


def test_check_support_asks_about_the_given_template():
    alg = _alg((Sized(),))
    check_support(alg, {}, "f", "d", frozenset())  # no parameters, nothing to keep
    with pytest.raises(ValueError, match=r"^f: 'toy' needs per-client state kept between "
                                         r"rounds, which the d cannot serve"):
        check_support(alg, PARAMS, "f", "d", frozenset())


def test_round_inputs_come_from_the_given_generator_only():
    """Parts first, then the codec, all from one generator; ``needs`` probes with its own
    generator, so asking what an algorithm needs leaves the global RNG (the run's seed) alone."""
    alg = _alg((Drawing(),), codec=CompressCodec("qsgd"))
    torch.manual_seed(5)
    expected = torch.rand(4)
    torch.manual_seed(5)
    assert alg.needs(PARAMS) == {"codec", "round_info"}
    assert torch.equal(torch.rand(4), expected)
    info = alg.round_info(3, torch.Generator().manual_seed(3))
    ref = torch.Generator().manual_seed(3)
    assert torch.equal(info["draw"], torch.rand(3, generator=ref))
    assert torch.equal(info["codec_key"], CompressCodec("qsgd").round_info(3, ref)["codec_key"])


def test_weighted_scalar_upload_keeps_its_dtype():
    """A 0-d float32 upload times a 0-d float64 scale would promote to float64."""
    fin = _fin({}, {UPLOAD_SCALE: torch.tensor(0.5, dtype=F64)})
    _, uploads = _alg((ScalarUpload(),)).finalize(fin)
    count = uploads["n"]["count"]
    assert count.dtype == torch.float32 and count.item() == 1.5


def test_hooks_pass_their_inputs_on():
    first, second = Preparing("p1"), Preparing("p2")
    alg = _alg((first, second))
    scorer = object()
    alg.bind_eval(scorer)
    assert first.evaluate is scorer and second.evaluate is scorer
    states = {"p1": {"k": torch.tensor(2.0)}, "p2": {"k": torch.tensor(5.0)}}
    prep = PrepareInputs(PARAMS, {}, states, {"given": 1}, None, None, None, None, None)
    new_states, info, _ = alg.prepare_cohort(prep)
    # the second part sees the first one's new state and round inputs
    assert second.states_seen[-1]["p1"]["k"].item() == 3.0 and second.seen[-1] == [
        "extra_p1", "given"]
    assert new_states["p2"]["k"].item() == 6.0 and set(info) == {"given", "extra_p1",
                                                                  "extra_p2"}
    loss_fn = object()
    alg.server_prepare(PARAMS, alg.server_init(PARAMS), loss_fn)
    assert first.server_seen == [(PARAMS, loss_fn)] and second.server_seen == [(PARAMS, loss_fn)]


def test_message_nbytes_of_a_round_dependent_codec():
    """MARINA with sync_prob 0: round 1 (and an unknown round) sends the full delta, 5 float32
    = 20 bytes; later rounds random-k, 2 values + an 8-byte seed = 16 bytes."""
    alg = _alg(codec=MarinaCodec(2, None, 0.0, 0))
    state = alg.server_init(PARAMS)
    assert alg.message_nbytes(PARAMS, state) == (32, 20)
    assert alg.message_nbytes(PARAMS, state, 1) == (32, 20)
    assert alg.message_nbytes(PARAMS, state, 3) == (32, 16)
