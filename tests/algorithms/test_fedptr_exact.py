"""Exact checks of FedPTR's pieces (src/fedforge/algorithms/fedptr.py), fast enough to rerun
for every mutant: the layer-adaptive prox, the projection's configuration and bookkeeping
(window, warm-up, MTT every k rounds, simulated work, timings) with trajectory matching, the
projection steps and the clock replaced by recorders, the client- and server-side hooks, and
what the factories build (docs/fedptr.md, docs/testing.md).
"""

import importlib
import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from fedforge.algorithms.fedptr import (
    ClientProjection,
    ProjectionConfig,
    ServerProjection,
    add_layer_prox,
    fedptr,
    fedptr_s,
    layer_of,
    push,
)
from fedforge.client.optimizers import local_optimizer
from fedforge.client.transforms import RoundContext, chain
from fedforge.core.tree import tree_stack
from fedforge.distill import init_synthetic
from fedforge.protocol.algorithm import (
    PREP_SAMPLES,
    PREP_SECONDS,
    SERVER_PREP_SAMPLES,
    SERVER_PREP_SECONDS,
    FinalizeInputs,
    PrepareInputs,
)
from fedforge.server.optimizers import server_sgd
from tests.algorithms.factory_paths import F64, X0, local_path, same, server_path

# the module itself (the package's ``fedptr`` attribute is the factory)
fp = importlib.import_module("fedforge.algorithms.fedptr")
LOSS_FN = object()  # never called: trajectory matching and the projection are recorded


def _ctx(params, info=None, broadcast=None):
    return RoundContext(params, broadcast or {}, {}, info or {})


def _t(*values, dtype=F64):
    return torch.tensor(values, dtype=dtype)


def test_layer_of():
    assert layer_of("features.0.weight") == "features.0"
    assert layer_of("a.b") == "a" and layer_of("w") == "w"


def test_layer_prox_adds_to_the_gradient_per_layer():
    """Layer a (a.w, a.b): w - w̃ = (3, 4 | 0), norm 5; layer c: (0, -2), norm 2. With λ = 0.5
    the adaptive prox adds 0.5 (3, 4 | 0)/5 and 0.5 (0, -2)/2; the fixed one 0.5 (w - w̃)."""
    params = {"a.w": _t(4.0, 6.0), "a.b": _t(1.0), "c": _t(1.0, -1.0)}
    anchor = {"a.w": _t(1.0, 2.0), "a.b": _t(1.0), "c": _t(1.0, 1.0)}
    g = {"a.w": _t(0.1, 0.2), "a.b": _t(-0.3), "c": _t(0.5, 0.0)}
    ctx = _ctx(params, {"anchor": anchor, "lam": _t(0.5)[0]})

    def anchor_fn(c):
        return c.info["anchor"], c.info["lam"]

    t = add_layer_prox(anchor_fn)
    assert t.name == "layer_prox" and t.init(params, ctx) == {}
    state = {"kept": 1}
    out, new_state = t.update(g, state, params, ctx)
    assert new_state is state and list(out) == ["a.w", "a.b", "c"]
    expected = {"a.w": _t(0.4, 0.6), "a.b": _t(-0.3), "c": _t(0.5, -0.5)}
    for k in expected:
        same(out[k], expected[k])
    fixed, fixed_state = add_layer_prox(anchor_fn, adaptive=False).update(g, state, params, ctx)
    assert fixed_state is state
    expected = {"a.w": _t(1.6, 2.2), "a.b": _t(-0.3), "c": _t(0.5, -1.0)}
    for k in expected:
        same(fixed[k], expected[k])


def test_layer_prox_clamps_a_tiny_norm():
    """||w - w̃|| = 1e-14 is clamped to ε = 1e-12: the prox adds λ · 1e-14 / 1e-12 = 0.01 λ."""
    params, anchor = {"w": _t(1e-14)}, {"w": _t(0.0)}
    g = {"w": _t(0.0)}
    out, _ = add_layer_prox(lambda c: (anchor, 2.0)).update(g, {}, params, _ctx(params))
    same(out["w"], _t(0.02))
    out, _ = add_layer_prox(lambda c: (anchor, 2.0), eps=1e-15).update(g, {}, params,
                                                                          _ctx(params))
    same(out["w"], _t(2.0))
    out, _ = add_layer_prox(lambda c: (params, 2.0)).update(g, {}, params, _ctx(params))
    assert out["w"].item() == 0.0  # at the anchor: no pull, no division by zero


def test_projection_config_defaults_and_errors():
    c = ProjectionConfig()
    assert (c.window, c.ipc, c.outer_steps, c.inner_steps, c.syn_lr, c.lr_img, c.lr_lr,
            c.proj_steps, c.proj_lr, c.mtt_every, c.augment) == (
        2, 10, 20, 10, 0.01, 1000.0, 1e-5, 5, 0.01, 1, False)
    ProjectionConfig(window=1, ipc=1, inner_steps=1, mtt_every=1, outer_steps=0, proj_steps=0,
                     lr_img=1e-9)  # the smallest allowed values
    for key in ("window", "ipc", "inner_steps", "mtt_every"):
        with pytest.raises(ValueError, match=rf"^algorithm\.{key}: expected an int >= 1, "
                                             rf"got 0$"):
            ProjectionConfig(**{key: 0})
    for key in ("outer_steps", "proj_steps"):
        with pytest.raises(ValueError, match=rf"^algorithm\.{key}: expected an int >= 0, "
                                             rf"got -1$"):
            ProjectionConfig(**{key: -1})
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match=rf"^algorithm\.lr_img: expected > 0, got {bad}$"):
            ProjectionConfig(lr_img=bad)


def test_push_drops_the_oldest_and_appends_a_detached_copy_in_the_window_dtype():
    window = {"w": torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])}
    new = _t(7.0, 8.0).requires_grad_()
    out = push(window, {"w": new})
    assert out["w"].dtype == torch.float32 and not out["w"].requires_grad
    assert out["w"].tolist() == [[3.0, 4.0], [5.0, 6.0], [7.0, 8.0]]
    assert window["w"][0].tolist() == [1.0, 2.0]  # the given window is left as it was


def test_projector_state_layout():
    part = ClientProjection(ProjectionConfig(window=2, ipc=3, syn_lr=0.25))
    assert (part.lam, part.adaptive, part.eval_every) == (0.0, True, 0)
    assert part.name == "fedptr" and part.prepares and ServerProjection.name == "fedptr_s"
    assert part.input_shape is None and part.num_classes == 0
    assert part._timing == {"fedptr_mtt_s": 0.0, "fedptr_proj_s": 0.0}
    assert part._projected is None and part._evaluate is None
    params = {"a": torch.ones(2, 3, dtype=F64), "b": torch.ones(4)}
    st = part.client_init(params)
    assert set(st) == {"window", "seen", "syn_lr"}  # no synthetic set before bind_data
    assert st["window"]["a"].shape == (3, 2, 3) and st["window"]["a"].dtype == F64
    assert st["window"]["b"].shape == (3, 4) and st["window"]["b"].dtype == torch.float32
    assert not st["window"]["a"].any() and not st["window"]["b"].any()
    assert st["seen"].shape == () and st["seen"].item() == 0.0
    assert st["syn_lr"].dtype == F64 and st["syn_lr"].item() == 0.25  # the first model's dtype
    part.bind_data([1, 2, 2], 4.0)
    assert part.input_shape == (1, 2, 2) and type(part.num_classes) is int
    syn = part.client_init(params)["syn_x"]
    assert syn.shape == (12, 1, 2, 2) and syn.dtype == F64 and not syn.any()
    assert part._labels("cpu").tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    with pytest.raises(ValueError, match=r"^algorithm\.eval_projected_every: expected an int "
                                         r">= 0, got -1$"):
        ClientProjection(ProjectionConfig(), eval_projected_every=-1)
    assert ClientProjection(ProjectionConfig(), eval_projected_every=0).eval_every == 0
    with pytest.raises(NotImplementedError):
        fp._Projector(ProjectionConfig()).anchor(_ctx(params))


def test_projected_model_bookkeeping():
    part = ClientProjection(ProjectionConfig(), eval_projected_every=3)
    w = _t(1.0, 2.0).requires_grad_()
    part._keep_projected(4, {"w": w}, True)  # not a multiple of 3
    part._keep_projected(3, {"w": w}, False)  # warm-up
    assert part._projected is None
    part._keep_projected(6, {"w": w}, True)
    round_, kept = part._projected
    assert round_ == 6 and kept["w"].tolist() == [1.0, 2.0] and not kept["w"].requires_grad
    part._timing = {"fedptr_mtt_s": 1.5, "fedptr_proj_s": 0.5}
    assert part.server_metrics({}, {}) == {"fedptr_mtt_s": 1.5, "fedptr_proj_s": 0.5}
    assert part._projected is not None  # kept until a scorer is bound
    part.bind_eval(lambda p: {"test_accuracy": float(p["w"].sum())})
    assert part.server_metrics({}, {}) == {"fedptr_mtt_s": 1.5, "fedptr_proj_s": 0.5,
                                           "fedptr_projected_accuracy": 3.0,
                                           "fedptr_projected_round": 6}
    assert part._projected is None
    part._start_round()
    assert part._timing == {"fedptr_mtt_s": 0.0, "fedptr_proj_s": 0.0}
    never = ClientProjection(ProjectionConfig())
    never._keep_projected(6, {"w": w}, True)
    assert never._projected is None


def test_prox_metric_is_zero_for_a_layer_at_its_anchor():
    x = {"a.w": _t(0.0, 1.0), "b.w": _t(2.0)}
    anchor = {"a.w": _t(3.0, 5.0), "b.w": _t(1.0)}
    client = {"a.w": _t(3.0, 5.0), "b.w": _t(-1.0)}  # layer a ends exactly at w̃
    ctx = _ctx(x, {"fedptr_anchor": anchor, "fedptr_lam": _t(0.2)[0]})
    delta = {k: x[k] - client[k] for k in x}
    fin = FinalizeInputs(ctx, delta, client, {}, None, torch.tensor(1.0))
    m = ClientProjection(ProjectionConfig(), lam=0.2).client_metrics(fin)
    assert m["fedptr_prox/a"].item() == 0.0 and m["fedptr_prox/b"].item() == pytest.approx(0.2)
    assert m["fedptr_anchor_dist/a"].item() == 5.0 and m["fedptr_anchor_dist/b"].item() == 1.0
    m = ClientProjection(ProjectionConfig(), lam=0.2, adaptive=False).client_metrics(fin)
    assert m["fedptr_prox/a"].item() == 0.0 and m["fedptr_prox/b"].item() == pytest.approx(0.4)


@pytest.fixture
def rec(monkeypatch):
    """Trajectory matching -> ``syn_x + 1`` and β = 0.5 (float32); the projection ->
    ``params + 10``; ``flip_shift(seed)`` -> a tag; the clock reads ``rec.ticks``."""
    calls = SimpleNamespace(mtt=[], descent=[], augment=[], ticks=iter(()))

    def match_trajectory(*args, **kwargs):
        calls.mtt.append((args, kwargs))
        return SimpleNamespace(syn_x=args[3] + 1, syn_lr=torch.tensor(0.5))

    def student_descent(*args):
        calls.descent.append(args)
        return {k: v + 10 for k, v in args[1].items()}

    def flip_shift(seed):
        calls.augment.append(seed)
        return ("augment", seed)

    monkeypatch.setattr(fp, "match_trajectory", match_trajectory)
    monkeypatch.setattr(fp, "student_descent", student_descent)
    monkeypatch.setattr(fp, "flip_shift", flip_shift)
    monkeypatch.setattr(fp, "time", SimpleNamespace(perf_counter=lambda: next(calls.ticks)))
    return calls


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_advance_warm_up_mtt_every_k_work_and_timing(rec):
    """m = 1: rounds 1-2 warm up; from round 3 the prox is on, and with ``mtt_every = 3`` D̃ is
    refitted in rounds 3, 6, ... n = 2 ipc x 3 classes = 6 images: an MTT round costs
    K n + 3 H R n = 5·6 + 3·3·4·6 = 246 per-sample gradients, a projection-only round 30."""
    cfg = ProjectionConfig(window=1, ipc=2, outer_steps=3, inner_steps=4, syn_lr=0.25,
                           lr_img=7.0, lr_lr=0.125, proj_steps=5, proj_lr=0.0625, mtt_every=3,
                           augment=True)
    part = ClientProjection(cfg, lam=0.3)
    part.bind_data((2,), 3)
    models = [{"l.w": _t(float(r), -float(r)).requires_grad_()} for r in range(1, 7)]
    state = part.client_init({"l.w": _t(0.0, 0.0)})
    syn0 = torch.arange(12.0, dtype=F64).view(6, 2)
    state["syn_x"] = syn0
    for r in (0, 1):  # warm-up: nothing runs, no clock is read
        state, anchor, active, sec, work = part._advance(state, models[r], LOSS_FN, 11)
        assert anchor is models[r] and (active, sec, work) == (False, 0.0, 0.0)
        assert state["seen"].item() == r + 1
    assert state["window"]["l.w"].tolist() == [[1.0, -1.0], [2.0, -2.0]]
    assert rec.mtt == [] and rec.descent == [] and rec.augment == []

    rec.ticks = iter([10.0, 11.5, 14.0])  # start, MTT done, projection done
    state, anchor, active, sec, work = part._advance(state, models[2], LOSS_FN, 11)
    assert (active, sec, work) == (True, 4.0, 246.0)
    assert part._timing == {"fedptr_mtt_s": 1.5, "fedptr_proj_s": 2.5}
    (args, kwargs), = rec.mtt
    assert len(args) == 6 and args[0] is LOSS_FN and args[2] is models[2]
    assert args[1]["l.w"].tolist() == [2.0, -2.0]  # w^{t-m}: the oldest model in the window
    assert torch.equal(args[3], syn0) and args[4].tolist() == [0, 0, 1, 1, 2, 2]
    assert args[5].dtype == F64 and args[5].item() == 0.25
    assert kwargs == {"outer_steps": 3, "inner_steps": 4, "lr_img": 7.0, "lr_lr": 0.125,
                      "augment": ("augment", 11)}
    assert rec.augment == [11]
    (d_args,) = rec.descent
    assert len(d_args) == 6 and d_args[0] is LOSS_FN
    assert d_args[1]["l.w"].tolist() == [3.0, -3.0] and not d_args[1]["l.w"].requires_grad
    assert torch.equal(d_args[2], syn0 + 1) and d_args[3].tolist() == [0, 0, 1, 1, 2, 2]
    assert d_args[4:] == (0.0625, 5)
    assert anchor["l.w"].tolist() == [13.0, 7.0]
    assert torch.equal(state["syn_x"], syn0 + 1)
    assert state["syn_lr"].dtype == F64 and state["syn_lr"].item() == 0.5

    rec.ticks = iter([20.0, 20.25])  # round 4: projection only, with the refitted set
    state, anchor, active, sec, work = part._advance(state, models[3], LOSS_FN, 12)
    assert (active, sec, work) == (True, 0.25, 30.0) and len(rec.mtt) == 1
    assert part._timing == {"fedptr_mtt_s": 1.5, "fedptr_proj_s": 2.75}
    assert torch.equal(rec.descent[-1][2], syn0 + 1) and anchor["l.w"].tolist() == [14.0, 6.0]
    assert rec.augment == [11]

    rec.ticks = iter([25.0, 25.5])  # round 5: projection only
    state, _, _, sec, work = part._advance(state, models[4], LOSS_FN, 13)
    assert (sec, work) == (0.5, 30.0) and len(rec.mtt) == 1

    rec.ticks = iter([30.0, 31.0, 33.0])  # round 6: refitted again
    state, _, _, sec, work = part._advance(state, models[5], LOSS_FN, 14)
    assert (sec, work) == (3.0, 246.0) and len(rec.mtt) == 2 and rec.augment == [11, 14]
    assert rec.mtt[-1][0][1]["l.w"].tolist() == [5.0, -5.0]
    assert torch.equal(state["syn_x"], syn0 + 2)


def test_advance_without_augmentation_or_a_bound_shape(rec):
    cfg = ProjectionConfig(window=1, ipc=1, outer_steps=1, inner_steps=1, proj_steps=1)
    params = {"w": _t(1.0)}
    part = ClientProjection(cfg)
    part.bind_data((1,), 2)
    state = {**part.client_init(params), "seen": torch.tensor(2.0)}
    rec.ticks = iter([0.0, 1.0, 2.0])
    part._advance(state, params, LOSS_FN, 5)
    assert rec.mtt[0][1]["augment"] is None and rec.augment == []
    unbound = ClientProjection(cfg)
    state = {**unbound.client_init(params), "seen": torch.tensor(2.0)}
    with pytest.raises(ValueError, match=r"^fedptr: the synthetic set's shape is unknown; call "
                                         r"algorithm\.bind_data\(input_shape, num_classes\) "
                                         r"first \(the runner does\)$"):
        unbound._advance(state, params, LOSS_FN, 5)


def test_client_round_info_draws_the_seeds():
    info = ClientProjection(ProjectionConfig()).round_info(4, torch.Generator().manual_seed(2))
    expected = torch.randint(2**31 - 1, (4,), generator=torch.Generator().manual_seed(2))
    assert list(info) == ["fedptr_seed"] and torch.equal(info["fedptr_seed"], expected)


def _cohort(part, seen, info, round_=4.0, data_dtype=F64):
    """Three clients, one step of two samples each (client 0's second is padding)."""
    x = {"w": _t(1.0, 2.0)}
    x_all = torch.arange(12.0, dtype=data_dtype).view(6, 2)
    y_all = torch.tensor([0, 1, 0, 2, 1, 1])
    sample_idx = torch.arange(6).view(3, 1, 2)
    weights = torch.ones(3, 1, 2)
    weights[0, 0, 1] = 0.0
    states = []
    for c, s in enumerate(seen):
        st = part.client_init(x)
        st["seen"] = torch.tensor(float(s))
        st["syn_x"] = torch.full_like(st["syn_x"], 5.0 + c)
        states.append(st)
    prep = PrepareInputs(x, {"round": torch.tensor(round_)}, {"fedptr": tree_stack(states)},
                         info, LOSS_FN, x_all, y_all, sample_idx, weights)
    return x, x_all, y_all, part.prepare_cohort(prep)


def test_prepare_cohort_per_client(rec):
    """m = 1. Client 0 joins for the first time (D̃_0 from its one real sample), client 1 for
    the third (MTT and projection, λ̃ = 0.3), client 2 for the second (warm-up)."""
    cfg = ProjectionConfig(window=1, ipc=1, outer_steps=1, inner_steps=1, proj_steps=2,
                           augment=True)
    part = ClientProjection(cfg, lam=0.3, eval_projected_every=2)
    part.bind_data((2,), 3)
    part._timing = {"fedptr_mtt_s": 9.0, "fedptr_proj_s": 9.0}  # last round's, reset
    rec.ticks = iter([0.0, 1.0, 3.0])
    seeds = torch.tensor([7, 8, 9])
    x, x_all, y_all, (states, info, metrics) = _cohort(part, [0, 2, 1],
                                                      {"fedptr_seed": seeds})
    d0 = init_synthetic(x_all[[0]], y_all[[0]], 3, 1, torch.Generator().manual_seed(7), (2,))
    assert torch.equal(states["syn_x"][0], d0)
    assert torch.equal(states["syn_x"][2], torch.full((3, 2), 7.0, dtype=F64))  # kept
    assert torch.equal(states["syn_x"][1], torch.full((3, 2), 7.0, dtype=F64))  # 6 + 1
    assert states["seen"].tolist() == [1.0, 3.0, 2.0]
    assert rec.augment == [8]  # client 1's own seed
    assert rec.mtt[0][0][0] is LOSS_FN and rec.descent[0][0] is LOSS_FN
    assert list(info) == ["fedptr_anchor", "fedptr_lam"]
    assert info["fedptr_anchor"]["w"].tolist() == [[1.0, 2.0], [11.0, 12.0], [1.0, 2.0]]
    assert info["fedptr_lam"].dtype == F64 and info["fedptr_lam"].tolist() == [0.0, 0.3, 0.0]
    assert set(metrics) == {PREP_SECONDS, PREP_SAMPLES}
    assert metrics[PREP_SECONDS].tolist() == [0.0, 3.0, 0.0]
    assert metrics[PREP_SAMPLES].tolist() == [0.0, 15.0, 0.0]  # K n + 3 H R n = 6 + 9
    assert part._timing == {"fedptr_mtt_s": 1.0, "fedptr_proj_s": 2.0}
    round_, mean = part._projected  # round 4, a multiple of 2: the cohort's mean w̃_i
    assert round_ == 4
    same(mean["w"], _t(13.0 / 3.0, 16.0 / 3.0))


def test_prepare_cohort_without_drawn_seeds_uses_the_client_index(rec):
    cfg = ProjectionConfig(window=1, ipc=1, outer_steps=1, inner_steps=1, augment=True)
    part = ClientProjection(cfg, lam=0.3, eval_projected_every=2)
    part.bind_data((2,), 3)
    rec.ticks = iter([0.0, 1.0, 3.0])
    _, x_all, y_all, (states, _, _) = _cohort(part, [0, 2, 1], {}, round_=3.0)
    d0 = init_synthetic(x_all[[0]], y_all[[0]], 3, 1, torch.Generator().manual_seed(0), (2,))
    assert torch.equal(states["syn_x"][0], d0) and rec.augment == [1]
    assert part._projected is None  # round 3 is not scored
    rec.ticks = iter([])
    # every client joins for the first time: nothing to score, and D̃_i from float32 data is
    # kept in the model's float64
    _, _, _, (states, _, _) = _cohort(part, [0, 0, 0], {}, round_=2.0, data_dtype=torch.float32)
    assert part._projected is None and states["syn_x"].dtype == F64


def test_server_projection(rec):
    cfg = ProjectionConfig(window=1, ipc=1, outer_steps=1, inner_steps=1, proj_steps=2,
                           augment=True)
    part = ServerProjection(cfg, lam=0.3, eval_projected_every=3)
    params = {"w": torch.tensor([1.0, 2.0])}
    assert "syn_x" not in part.server_init(params)
    part.bind_data((2,), 3)
    torch.manual_seed(4)
    state = part.server_init(params)
    torch.manual_seed(4)
    assert torch.equal(state["syn_x"], torch.randn(3, 2))  # the run's seeded global RNG
    assert torch.equal(state["anchor"]["w"], params["w"])
    assert state["anchor"]["w"] is not params["w"]
    assert part.broadcast(state) == {"anchor": state["anchor"]}
    assert part.broadcast(state)["anchor"] is state["anchor"]
    syn0 = state["syn_x"]
    for r in (1, 2):  # seen 0 -> 1, 1 -> 2: warm-up, w̃ = w^t
        w = {"w": torch.tensor([float(r), 0.0], requires_grad=True)}
        state, metrics = part.server_prepare(w, state, LOSS_FN)
        assert state["anchor"]["w"].tolist() == [float(r), 0.0]
        assert not state["anchor"]["w"].requires_grad
        assert set(metrics) == {SERVER_PREP_SECONDS, SERVER_PREP_SAMPLES}
        assert metrics[SERVER_PREP_SECONDS].item() == metrics[SERVER_PREP_SAMPLES].item() == 0.0
    assert part._projected is None
    rec.ticks = iter([5.0, 6.0, 9.0])
    part._timing = {"fedptr_mtt_s": 9.0, "fedptr_proj_s": 9.0}
    state, metrics = part.server_prepare({"w": torch.tensor([3.0, 0.0])}, state, LOSS_FN)
    assert rec.augment == [2]  # the seed is the rounds seen before this one
    assert rec.mtt[0][0][0] is LOSS_FN and rec.descent[0][0] is LOSS_FN
    assert rec.mtt[0][0][1]["w"].tolist() == [2.0, 0.0] and torch.equal(rec.mtt[0][0][3], syn0)
    assert state["anchor"]["w"].tolist() == [13.0, 10.0]
    assert metrics[SERVER_PREP_SECONDS].item() == 4.0
    assert metrics[SERVER_PREP_SAMPLES].item() == 15.0
    assert part._timing == {"fedptr_mtt_s": 1.0, "fedptr_proj_s": 3.0}
    round_, kept = part._projected  # round 3 = seen before + 1
    assert round_ == 3 and kept["w"].tolist() == [13.0, 10.0]


def test_anchors_seen_by_the_clients():
    x = {"a": _t(1.0, 2.0), "b": _t(3.0)}
    fn = fp._server_anchor(0.3)
    same_model = {k: v.clone() for k, v in x.items()}
    anchor, lam = fn(_ctx(x, broadcast={"fedptr_s": {"anchor": same_model}}))
    assert anchor is same_model and lam.dtype == F64 and lam.item() == 0.0
    one_moved = {"a": _t(1.0, 2.5), "b": _t(3.0)}  # a single coordinate differs
    anchor, lam = fn(_ctx(x, broadcast={"fedptr_s": {"anchor": one_moved}}))
    assert anchor is one_moved and lam.dtype == F64 and lam.item() == pytest.approx(0.3)
    part = ServerProjection(ProjectionConfig(), lam=0.3)
    assert part.anchor(_ctx(x, broadcast={"fedptr_s": {"anchor": one_moved}}))[1].item() == (
        pytest.approx(0.3))
    info = {"fedptr_anchor": one_moved, "fedptr_lam": _t(0.7)}
    got = ClientProjection(ProjectionConfig()).anchor(_ctx(x, info))
    assert got[0] is one_moved and got[1] is info["fedptr_lam"]


ANCHOR = {"w": _t(1.0, 1.0)}
LAM = _t(0.4)[0]


def _local_path(tx):
    """Three local steps from X0 with the anchor w̃ = (1, 1) both sides see (λ = 0.4)."""
    ctx = RoundContext({"w": X0.clone()}, {"round": torch.tensor(1.0, dtype=F64),
                                           "fedptr_s": {"anchor": ANCHOR}}, {},
                       {"fedptr_anchor": ANCHOR, "fedptr_lam": LAM})
    return local_path(tx, ctx)


NON_DEFAULT = {"window": 3, "ipc": 2, "outer_steps": 4, "inner_steps": 5, "syn_lr": 0.02,
               "lr_img": 50.0, "lr_lr": 0.001, "proj_steps": 6, "proj_lr": 0.03,
               "mtt_every": 2, "augment": True}


@pytest.mark.parametrize("factory", [fedptr, fedptr_s])
def test_factories_pass_every_argument(factory):
    server_side = factory is fedptr_s
    alg = factory(local_lr=0.2, lam=0.4, adaptive=False, client_optimizer="momentum",
                  local_momentum=0.3, weight_decay=0.1, eval_projected_every=4, **NON_DEFAULT)
    (part,) = alg.parts
    assert type(part) is (ServerProjection if server_side else ClientProjection)
    assert (part.lam, part.adaptive, part.eval_every) == (0.4, False, 4)
    assert part.cfg == ProjectionConfig(**NON_DEFAULT)
    assert alg.name == ("fedptr_s" if server_side else "fedptr")
    where = "server-side MTT (one noise-initialised D̃)" if server_side else "client-side MTT"
    assert alg.description == (f"{'FedPTR-S' if server_side else 'FedPTR'} (Chen et al. "
                               f"2023): {where}, fixed prox towards the projected model")
    assert alg.hparams == {"lam": 0.4, "adaptive": False, "eval_projected_every": 4,
                           **NON_DEFAULT}
    anchor_fn = fp._server_anchor(0.4) if server_side else fp._client_anchor
    ref = chain(add_layer_prox(anchor_fn, adaptive=False),
                local_optimizer("momentum", 0.2, momentum=0.3, weight_decay=0.1))
    same(_local_path(alg.local_optimizer), _local_path(ref))
    same(server_path(alg.server_optimizer), server_path(server_sgd(1.0)))
    sgd = factory(local_lr=0.2, lam=0.4, client_optimizer="sgd")
    ref = chain(add_layer_prox(anchor_fn), local_optimizer("sgd", 0.2))
    same(_local_path(sgd.local_optimizer), _local_path(ref))


@pytest.mark.parametrize("factory", [fedptr, fedptr_s])
def test_factory_defaults(factory):
    """Sec. 5.1: SGD lr 0.01, momentum 0.5, λ 0.05; the prox layer-adaptive."""
    server_side = factory is fedptr_s
    alg = factory()
    (part,) = alg.parts
    assert part.cfg == ProjectionConfig()
    assert (part.lam, part.adaptive, part.eval_every) == (0.05, True, 0)
    assert alg.hparams == {"lam": 0.05, "adaptive": True, "eval_projected_every": 0,
                           "window": 2, "ipc": 10, "outer_steps": 20, "inner_steps": 10,
                           "syn_lr": 0.01, "lr_img": 1000.0, "lr_lr": 1e-5, "proj_steps": 5,
                           "proj_lr": 0.01, "mtt_every": 1, "augment": False}
    anchor_fn = fp._server_anchor(0.05) if server_side else fp._client_anchor
    ref = chain(add_layer_prox(anchor_fn),
                local_optimizer("momentum", 0.01, momentum=0.5, weight_decay=0.0))
    same(_local_path(alg.local_optimizer), _local_path(ref))
    same(server_path(alg.server_optimizer), server_path(server_sgd(1.0)))
    page = (Path(__file__).resolve().parents[2] / "docs" / "algorithms.md").read_text()
    assert f"\nsync: {alg.description}\n" in page


def test_factory_errors_and_signature():
    fedptr(lam=0.0)
    fedptr_s(lam=0.0)
    for factory in (fedptr, fedptr_s):
        with pytest.raises(ValueError, match=r"^algorithm\.lam: expected lam >= 0, got -0\.5$"):
            factory(lam=-0.5)
    with pytest.raises(TypeError):
        fedptr_s(momentum=0.9)  # not a FedPTR hyper-parameter
    assert fedptr_s.__signature__ == inspect.signature(fedptr)


def test_server_side_synthetic_set_follows_a_float64_model_under_a_float32_default():
    """The noise-initialised D̃ of FedPTR-S takes the model's dtype, not torch's default."""
    from fedforge.algorithms.fedptr import ProjectionConfig, ServerProjection

    part = ServerProjection(ProjectionConfig())
    part.bind_data([1, 2, 2], 3)
    syn = part.server_init({"w": torch.zeros(3, 2, dtype=F64)})["syn_x"]
    assert torch.get_default_dtype() == torch.float32
    assert syn.dtype == F64 and syn.shape[1:] == (1, 2, 2) and syn.abs().sum() > 0
