"""Personalised methods against independent float64 NumPy loops, four rounds of partial
participation (tests/algorithms/multiround.py's cohorts and step counts, client 4 without data
in round 3).

The model has a body and a head, ``{"body": [2], "head": [2]}``, and client i's loss is
``a_i/2 ||body + 2 head - b_i||²``: the head's gradient is twice the body's, so training the
wrong part, sending a kept part, or starting from the global value instead of the client's
own gives different numbers. Each reference reads nothing from fedforge.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedforge.algorithms import algorithm_hparams, build_algorithm
from fedforge.algorithms.personal import PERSONAL_ALGORITHMS, Personal, Phase, personalised
from fedforge.algorithms.personal.split import PARTS, freeze, head_names, select
from fedforge.algorithms.personal.stateful import stepping
from fedforge.client.optimizers import local_optimizer
from fedforge.client.transforms import RoundContext, chain, local_step
from fedforge.core.store import ClientStore
from fedforge.core.tree import flatten_dict
from fedforge.engine import LoopEngine, VmapEngine
from fedforge.engine.draw import RoundDraw
from fedforge.engine.round import RoundSetup, federated_round
from tests.algorithms.multiround import SCHEDULE, A, B, K, N

LR = 0.1
BODY0, HEAD0 = np.array([0.3, -0.2]), np.array([0.1, 0.4])
HEAD = ["head"]


def loss(params, x, y, w):
    del y
    a, b = x[:, 0], x[:, 1:]
    u = params["body"] + 2.0 * params["head"]
    per_sample = 0.5 * a * ((u - b) ** 2).sum(-1)
    return (per_sample * w).sum() / w.sum().clamp_min(1.0)


def grads(i, body, head):
    r = A[i] * (body + 2.0 * head - B[i])
    return r, 2.0 * r


def run(algorithm, engine=None):
    """fedforge's trajectory: (body, head, stored client state) after every round."""
    engine = engine or LoopEngine()
    x_all = torch.tensor(np.c_[A, B], dtype=torch.float64)
    y_all = torch.zeros(N, dtype=torch.long)
    params = {"body": torch.tensor(BODY0), "head": torch.tensor(HEAD0)}
    server_state = algorithm.server_init(params)
    store = ClientStore(N, algorithm.client_init(params))
    out = []
    for t, (ids, steps) in enumerate(SCHEDULE, start=1):
        ids_t = torch.tensor(ids)
        sample_idx = ids_t.view(-1, 1, 1).expand(-1, K, 1).clone()
        weights = torch.zeros(sample_idx.shape, dtype=torch.float64)
        for c, k in enumerate(steps):
            weights[c, :k] = 1.0
        params, server_state, _ = federated_round(
            RoundSetup(algorithm, engine, loss, store, x_all, y_all), params, server_state,
            RoundDraw(ids_t, sample_idx, weights, round=t))
        state = {k: v.numpy().copy()
                 for k, v in flatten_dict(store.gather(torch.arange(N))).items()}
        out.append((params["body"].numpy().copy(), params["head"].numpy().copy(), state))
    return out


def reference(kept: str | None = None, train: str = "both", head_passes: int = 0,
              ditto_lam: float | None = None, side_passes: int = 1):
    """Round by round (body, head, personal state [N, 2] by leaf) of one method's rule."""
    body, head = BODY0.copy(), HEAD0.copy()
    mine = {"body": np.tile(BODY0, (N, 1)), "head": np.tile(HEAD0, (N, 1))}
    v = {"body": np.tile(BODY0, (N, 1)), "head": np.tile(HEAD0, (N, 1))}  # Ditto's v_i
    out = []
    for ids, steps in SCHEDULE:
        d_body, d_head = np.zeros(2), np.zeros(2)
        for i, k in zip(ids, steps, strict=True):
            if ditto_lam is not None:  # v_i: k steps on f_i + lam/2 ||v - w^t||²
                vb, vh = v["body"][i].copy(), v["head"][i].copy()
                for _ in range(side_passes * k):
                    gb, gh = grads(i, vb, vh)
                    vb, vh = (vb - LR * (gb + ditto_lam * (vb - body)),
                              vh - LR * (gh + ditto_lam * (vh - head)))
                v["body"][i], v["head"][i] = vb, vh
            b = mine["body"][i].copy() if kept == "body" else body.copy()
            h = mine["head"][i].copy() if kept == "head" else head.copy()
            for _ in range(head_passes * k):  # FedRep: the head alone, the body fixed
                h = h - LR * grads(i, b, h)[1]
            for _ in range(k):
                gb, gh = grads(i, b, h)
                b = b - LR * gb if train in ("both", "body") else b
                h = h - LR * gh if train in ("both", "head") else h
            if kept is not None:
                mine[kept][i] = b if kept == "body" else h
            d_body += (body - b) / len(ids) if kept != "body" else 0.0
            d_head += (head - h) / len(ids) if kept != "head" else 0.0
        body, head = body - d_body, head - d_head
        out.append((body.copy(), head.copy(),
                    {"body": mine["body"].copy(), "head": mine["head"].copy(),
                     "v_body": v["body"].copy(), "v_head": v["head"].copy()}))
    return out


CASES = {  # name -> (hparams, reference, stored leaves: store key -> reference key)
    "fedper": ({"head": HEAD}, {"kept": "head"}, {"personal/head": "head"}),
    "lg_fedavg": ({"head": HEAD}, {"kept": "body"}, {"personal/body": "body"}),
    "fedrep": ({"head": HEAD, "head_passes": 2}, {"kept": "head", "train": "body",
                                                   "head_passes": 2}, {"personal/head": "head"}),
    "fedbabu": ({"head": HEAD}, {"train": "body"}, {}),
    "ditto": ({"lam": 0.7}, {"ditto_lam": 0.7}, {"personal/body": "v_body",
                                                 "personal/head": "v_head"}),
    "fedavg_ft": ({}, {}, {}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_rounds_match_the_rule(name):
    hparams, rule, stored = CASES[name]
    got = run(build_algorithm(name, local_lr=LR, **hparams))
    want = reference(**rule)
    for t, ((gb, gh, gs), (wb, wh, ws)) in enumerate(zip(got, want, strict=True), start=1):
        np.testing.assert_allclose(gb, wb, rtol=1e-12, atol=1e-14, err_msg=f"{name} {t}: body")
        np.testing.assert_allclose(gh, wh, rtol=1e-12, atol=1e-14, err_msg=f"{name} {t}: head")
        assert set(gs) == set(stored), f"{name}: stored state {sorted(gs)}"
        for key, ref_key in stored.items():
            np.testing.assert_allclose(gs[key], ws[ref_key], rtol=1e-12, atol=1e-14,
                                       err_msg=f"{name} round {t}: {key}")


def test_local_only_keeps_everything_and_sends_nothing():
    got = run(build_algorithm("local_only", local_lr=LR))
    want_b, want_h = np.tile(BODY0, (N, 1)), np.tile(HEAD0, (N, 1))
    for (gb, gh, gs), (ids, steps) in zip(got, SCHEDULE, strict=True):
        for i, k in zip(ids, steps, strict=True):
            b, h = want_b[i], want_h[i]
            for _ in range(k):
                g_b, g_h = grads(i, b, h)
                b, h = b - LR * g_b, h - LR * g_h
            want_b[i], want_h[i] = b, h
        np.testing.assert_allclose(gb, BODY0)  # the global model never moves
        np.testing.assert_allclose(gh, HEAD0)
        np.testing.assert_allclose(gs["personal/body"], want_b, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(gs["personal/head"], want_h, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", ["ditto", "fedrep", "fedper", "lg_fedavg", "fedbabu",
                                  "local_only"])
def test_loop_equals_vmap(name):
    hp = {} if name in ("ditto", "local_only") else {"head": HEAD}
    algorithm = build_algorithm(name, local_lr=LR, **hp)
    ref, got = run(algorithm), run(algorithm, VmapEngine(chunk_size=2))
    for (rb, rh, rs), (gb, gh, gs) in zip(ref, got, strict=True):
        np.testing.assert_allclose(gb, rb, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(gh, rh, rtol=1e-12, atol=1e-14)
        for key in rs:
            np.testing.assert_allclose(gs[key], rs[key], rtol=1e-12, atol=1e-14)


def test_backbones_are_config_switches():
    """Ditto over FedNAR's co-clipped decay and FedRep over local AMSGrad: existing parts,
    and each switch changes the trajectory."""
    base = run(build_algorithm("ditto", local_lr=LR, lam=0.5))
    nar = run(build_algorithm("ditto", local_lr=LR, lam=0.5, nar=True, weight_decay=0.1,
                              max_grad_norm=1.0))
    rep = run(build_algorithm("fedrep", local_lr=LR, head=HEAD))
    ams = run(build_algorithm("fedrep", local_lr=LR, head=HEAD, client_optimizer="amsgrad"))
    for a, b in ((base, nar), (rep, ams)):
        assert np.isfinite(b[-1][0]).all() and not np.allclose(a[-1][0], b[-1][0])


def test_the_extending_snippet_runs():
    """docs/extending.md's personalised method, executed as written, trains the cnn with
    its two-layer head kept per client."""
    from pathlib import Path

    import fedforge.algorithms as registry
    from fedforge.models import build_model

    text = (Path(__file__).resolve().parents[2] / "docs" / "extending.md").read_text()
    section = text[text.index("## A personalised method"):]
    code = section[section.index("```python") + 9: section.index("```", section.index(
        "```python") + 9)]
    try:
        exec(compile(code, "extending.md", "exec"), {})  # noqa: S102 (the doc's own code)
        algorithm = build_algorithm("fedper_deep_head")
        model = build_model("cnn", (1, 28, 28), 10)
        params = {k: v.detach() for k, v in model.named_parameters()}
        kept = set(algorithm.client_init(params)["personal"])
        assert kept == {k for k in params if k.startswith("classifier.")}
    finally:
        registry.ALGORITHMS.pop("fedper_deep_head", None)


def test_ditto_personal_passes_repeat_the_side_models_steps():
    got = run(build_algorithm("ditto", local_lr=LR, lam=0.7, personal_passes=2))
    want = reference(ditto_lam=0.7, side_passes=2)
    for (gb, _, gs), (wb, _, ws) in zip(got, want, strict=True):
        np.testing.assert_allclose(gb, wb, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(gs["personal/body"], ws["v_body"], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(gs["personal/head"], ws["v_head"], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("part", PARTS)
def test_finetuner_trains_only_its_part(part):
    """The evaluation-time fine-tuning is a plain algorithm (server step 1) whose local
    steps change ``finetune_part`` only: four rounds of it are FedAvg on that part."""
    spec = build_algorithm("fedbabu", local_lr=LR, head=HEAD, finetune_part=part).personal
    tuner = spec.finetuner()
    assert tuner.name == "finetune"
    got = run(tuner)
    want = reference(train={"all": "both", "head": "head", "body": "body",
                            "none": "none"}[part])
    for t, ((gb, gh, _), (wb, wh, _)) in enumerate(zip(got, want, strict=True), start=1):
        np.testing.assert_allclose(gb, wb, rtol=1e-12, atol=1e-14, err_msg=f"{part} {t}")
        np.testing.assert_allclose(gh, wh, rtol=1e-12, atol=1e-14, err_msg=f"{part} {t}")


def test_fedbabu_fine_tunes_at_its_own_rate():
    """``finetune_lr`` replaces the training rate in the fine-tuning steps only: four rounds
    of the tuner equal those of a FedBABU trained at that rate, and differ from the default
    (the training rate)."""
    slow = LR / 10
    got = run(build_algorithm("fedbabu", local_lr=LR, finetune_lr=slow, head=HEAD).personal
              .finetuner())
    want = run(build_algorithm("fedbabu", local_lr=slow, head=HEAD).personal.finetuner())
    default = run(build_algorithm("fedbabu", local_lr=LR, head=HEAD).personal.finetuner())
    for (gb, gh, _), (wb, wh, _) in zip(got, want, strict=True):
        np.testing.assert_allclose(gb, wb, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(gh, wh, rtol=1e-12, atol=1e-14)
    assert not np.allclose(got[-1][0], default[-1][0])


def test_finetuner_over_a_frozen_chain_and_without_an_optimizer():
    """A fine-tuning optimizer that already freezes a part still chains (distinct names);
    a spec without one has no fine-tuning."""
    opt = local_optimizer("sgd", LR)
    frozen = Phase(chain(opt, freeze("head", HEAD)))
    assert Personal(head=tuple(HEAD), finetune=frozen, finetune_part="body").finetuner()
    assert Personal().finetuner() is None


def test_client_params_are_the_kept_leaves_over_the_global_model():
    spec = Personal(kept="head", head=tuple(HEAD))
    g = {"body": torch.tensor([1.0, 2.0]), "head": torch.tensor([3.0, 4.0])}
    mine = {"personal": {"head": torch.tensor([5.0, 6.0])}}
    got = spec.client_params(g, mine)
    assert set(got) == {"body", "head"}
    assert got["body"].tolist() == [1.0, 2.0] and got["head"].tolist() == [5.0, 6.0]
    assert {k: v.tolist() for k, v in spec.client_params(g, {}).items()} == {
        "body": [1.0, 2.0], "head": [3.0, 4.0]}


def test_with_head_replaces_the_split_only():
    spec = Personal(kept="head", finetune_part="head", finetune_steps=3)
    assert spec.with_head(None) is spec
    other = spec.with_head(["a", "b"])
    assert other.head == ("a", "b") and isinstance(other.head, tuple)
    assert (other.kept, other.finetune_part, other.finetune_steps) == ("head", "head", 3)
    assert spec.head is None


@pytest.mark.parametrize("kwargs, message", [
    ({"kept": "x"}, "personal.kept: expected one of ('none', 'head', 'body', 'all'), got 'x'"),
    ({"finetune_part": "y"},
     "personal.finetune_part: expected one of ('none', 'head', 'body', 'all'), got 'y'"),
    ({"kept": "head", "side": Phase(local_optimizer("sgd", LR))},
     "personal: a method keeps either leaves of the shared model or a separate personal "
     "model, not both"),
    ({"finetune_steps": -1}, "algorithm.finetune_steps: expected >= 0, got -1"),
])
def test_spec_errors_are_one_line_naming_the_field(kwargs, message):
    with pytest.raises(ValueError) as err:
        Personal(**kwargs)
    assert str(err.value) == message


STATELESS = {"fedavg_ft", "fedbabu", "per_fedavg_fo", "per_fedavg_hf"}  # nothing per client
TWO_PARTS = {"fedproto"}  # its personal model and the server's prototypes


@pytest.mark.parametrize("name", sorted(PERSONAL_ALGORITHMS))
def test_every_method_weights_by_samples_and_keeps_state_only_when_it_has_some(name):
    algorithm = build_algorithm(name)
    assert algorithm.aggregation == "num_samples"
    assert len(algorithm.parts) == (0 if name in STATELESS else 2 if name in TWO_PARTS else 1)


def test_personalised_copies_its_hparams():
    opt = local_optimizer("sgd", LR)
    given = {"lam": 0.5}
    algorithm = personalised("m", opt, Personal(), "d", given)
    assert algorithm.hparams == {"lam": 0.5} and algorithm.hparams is not given
    assert personalised("m", opt, Personal(), "d").hparams == {}
    assert algorithm.parts == () and algorithm.personal == Personal()


def _point():
    """The model and a gradient, float64 (large enough that a 0.05 clip binds)."""
    params = {"body": torch.tensor(BODY0), "head": torch.tensor(HEAD0)}
    grads = {"body": torch.tensor([1.0, -2.0], dtype=torch.float64),
             "head": torch.tensor([0.5, 3.0], dtype=torch.float64)}
    ctx = RoundContext(params, {"round": torch.tensor(1.0, dtype=torch.float64)}, {}, {})
    return params, grads, ctx


def _build(name, **hparams):
    split = {"head": HEAD} if name in ("fedper", "fedrep", "fedbabu", "lg_fedavg",
                                       "fedrod") else {}
    if name == "fedproto":  # its default momentum is the code's 0.5; the chain below takes 0.9
        hparams = {"local_momentum": 0.9, **hparams}
    return build_algorithm(name, local_lr=LR, **split, **hparams)


KNOBS = {"weight_decay": 0.1, "max_grad_norm": 0.05}
WITH_KNOBS = sorted(set(PERSONAL_ALGORITHMS) - {"per_fedavg_fo", "per_fedavg_hf"})


@pytest.mark.parametrize("nar", [False, True])
@pytest.mark.parametrize("name", WITH_KNOBS)
def test_client_optimizer_knobs_reach_the_local_optimizer(name, nar):
    """The method's optimizer (its local steps' and fine-tuning's) is client_optimizer's
    chain with the given decay, clip and FedNAR switch: two steps equal the chain built
    directly (Per-FedAvg's meta step: its own test file)."""
    opt = _build(name, client_optimizer="momentum", nar=nar, **KNOBS).personal.finetune.optimizer
    want = local_optimizer("momentum", LR, nar=nar, **KNOBS)
    params, grads, ctx = _point()
    got_p, want_p = params, params
    got_s, want_s = opt.init(params, ctx), want.init(params, ctx)
    for _ in range(2):
        got_p, got_s = local_step(opt, grads, got_s, got_p, ctx)
        want_p, want_s = local_step(want, grads, want_s, want_p, ctx)
        for k in params:
            np.testing.assert_allclose(got_p[k].numpy(), want_p[k].numpy(), rtol=1e-14)
    plain = local_step(local_optimizer("momentum", LR), grads,
                       local_optimizer("momentum", LR).init(params, ctx), params, ctx)[0]
    assert not np.allclose(plain["body"].numpy(), got_p["body"].numpy())


@pytest.mark.parametrize("name", sorted(PERSONAL_ALGORITHMS))
def test_a_client_without_state_evaluates_the_global_model(name):
    g = _point()[0]
    got = _build(name).personal.client_params(g, {})
    assert set(got) == set(g)
    for k in g:
        assert torch.equal(got[k], g[k])


STEP_BATCH = ("apfl", "pfedme", "fedrod", "fedala", "per_fedavg_fo", "per_fedavg_hf")


@pytest.mark.parametrize("name", STEP_BATCH)
def test_a_step_without_the_batch_is_refused_naming_the_method(name):
    """Outside a local round the step's batch is missing: a one-line error naming the
    method (its optimizer state starts from the client store, momentum included)."""
    algorithm = _build(name, client_optimizer="momentum")
    params, grads, ctx = _point()
    ctx = ctx._replace(client_state=algorithm.client_init(params))
    opt = algorithm.personal.ala if name == "fedala" else algorithm.local_optimizer
    state = opt.init(params, ctx)
    with pytest.raises(ValueError) as err:
        local_step(opt, grads, state, params, ctx)
    assert str(err.value) == (f"algorithm {name!r}: its local step needs the step's batch "
                              "(a personal spec with step_batch = True)")


@pytest.mark.parametrize("name, hparams, message", [
    ("apfl", {"alpha": -0.1}, "algorithm.alpha: expected a mixing weight in [0, 1], got -0.1"),
    ("apfl", {"alpha": 1.5}, "algorithm.alpha: expected a mixing weight in [0, 1], got 1.5"),
    ("pfedme", {"lam": 0.0}, "algorithm.lam: expected lam > 0, got 0.0"),
    ("pfedme", {"inner_steps": 0}, "algorithm.inner_steps: expected an integer >= 1, got 0"),
    ("ditto", {"lam": -1.0}, "algorithm.lam: expected lam >= 0, got -1.0"),
    ("ditto", {"personal_passes": 0},
     "algorithm.personal_passes: expected an integer >= 1, got 0"),
    ("fedrep", {"head_passes": 0}, "algorithm.head_passes: expected an integer >= 1, got 0"),
    ("fedala", {"rand_percent": 100.5},
     "algorithm.rand_percent: expected a percentage in (0, 100], got 100.5"),
    ("fedala", {"layer_idx": 0}, "algorithm.layer_idx: expected an integer >= 1, got 0"),
    ("fedala", {"eta": -0.5}, "algorithm.eta: expected eta >= 0, got -0.5"),
])
def test_bad_hparams_are_one_line_naming_the_field(name, hparams, message):
    with pytest.raises(ValueError) as err:
        _build(name, **hparams)
    assert str(err.value) == message


@pytest.mark.parametrize("name, hparams", [
    ("apfl", {"alpha": 0.0}), ("apfl", {"alpha": 1.0}), ("pfedme", {"lam": 0.5}),
    ("pfedme", {"inner_steps": 1}), ("ditto", {"lam": 0.0}), ("ditto", {"personal_passes": 1}),
    ("fedrep", {"head_passes": 1}), ("fedala", {"rand_percent": 100.0}),
    ("fedala", {"rand_percent": 0.5}), ("fedala", {"layer_idx": 1}), ("fedala", {"eta": 0.0}),
])
def test_boundary_hparams_are_accepted(name, hparams):
    assert _build(name, **hparams).name == name


# the evaluation-time fine-tuning of each method: the part it changes (FedPer, FedRep: the
# personal head; LG-FedAvg: the personal body) and whether its steps are a knob
FINETUNE_PART = {"fedper": "head", "fedrep": "head", "lg_fedavg": "body"}
FINETUNE_STEPS = ("fedavg_ft", "fedbabu", "per_fedavg_fo", "per_fedavg_hf")


@pytest.mark.parametrize("name", sorted(PERSONAL_ALGORITHMS))
def test_every_methods_fine_tuning_part_and_steps(name):
    spec = _build(name, **({"finetune_steps": 7} if name in FINETUNE_STEPS else {})).personal
    assert spec.finetune is not None
    assert spec.finetune_part == FINETUNE_PART.get(name, "all")
    assert spec.finetune_steps == (7 if name in FINETUNE_STEPS else 0)
    if name == "fedbabu":
        assert _build(name, finetune_part="body").personal.finetune_part == "body"


@pytest.mark.parametrize("n, shown", [
    (8, "p0, p1, p2, p3, p4, p5, p6, p7"),
    (9, "p0, p1, p2, p3, p4, p5, p6, p7 ..."),
])
def test_a_head_pattern_matching_nothing_names_the_field_and_the_parameters(n, shown):
    names = [f"p{i}" for i in range(n)]
    with pytest.raises(ValueError) as err:
        head_names(names, ["p1", "zz"])
    assert str(err.value) == (f"model.head: pattern 'zz' matches no parameter of the model "
                              f"(parameters: {shown})")
    with pytest.raises(ValueError, match=r"^algorithm\.norm: pattern 'zz'"):
        head_names(names, ["zz"], "algorithm.norm")


def test_select_refuses_an_unknown_part_and_freeze_is_named_freeze():
    with pytest.raises(ValueError) as err:
        select(["a"], "legs", None)
    assert str(err.value) == ("personal part: expected one of ('none', 'head', 'body', 'all'), "
                              "got 'legs'")
    assert freeze("head", None).name == "freeze"  # its key in a chained optimizer's state


@pytest.mark.parametrize("name, key", [("apfl", "alpha_lr"), ("pfedme", "personal_lr")])
def test_a_bad_personal_step_schedule_names_its_field(name, key):
    with pytest.raises(ValueError) as err:
        _build(name, **{key: {"kind": "zz"}})
    assert str(err.value).startswith(f"{key}: schedule kind 'zz' unknown")


@pytest.mark.parametrize("name", sorted(n for n in PERSONAL_ALGORITHMS
                                        if "head" in algorithm_hparams(n)))
def test_the_spec_records_the_methods_split(name):
    """The split a method was built with is its spec's (fine-tuning freezes by it)."""
    assert build_algorithm(name, head=["head", "x.*"]).personal.head == ("head", "x.*")
    assert build_algorithm(name).personal.head is None


def test_stepping_derives_its_additive_update_from_the_whole_step():
    """A method given by its whole step (APFL, pFedMe, Per-FedAvg, FedRoD, FedALA's weights)
    is still a transform with an update: ``new - params``, the step's state."""
    def step(grads, state, params, ctx):
        return ({k: 2.0 * p - 0.5 * ctx.round * grads[k] for k, p in params.items()},
                {"n": state["n"] + 1})

    opt = stepping("whole", lambda params, ctx: {"n": 0}, step)
    params, grads, ctx = _point()
    assert opt.name == "whole" and opt.init(params, ctx) == {"n": 0}
    updates, state = opt.update(grads, {"n": 3}, params, ctx)
    new, state2 = local_step(opt, grads, {"n": 3}, params, ctx)
    assert state == state2 == {"n": 4}
    for k in params:
        np.testing.assert_allclose(updates[k].numpy(),
                                   (params[k] - 0.5 * grads[k]).numpy(), rtol=1e-15)
        # a local step is the whole step itself, not params + (new - params) (which rounds)
        assert torch.equal(new[k], 2.0 * params[k] - 0.5 * grads[k])
