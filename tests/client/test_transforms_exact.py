"""Exact checks of every client gradient transform (src/fedforge/client/transforms.py).

SGD and Adam are compared step by step with ``torch.optim.SGD`` / ``torch.optim.Adam`` (an
independent implementation of the same semantics: coupled L2 decay, heavy-ball momentum
without dampening, Nesterov, bias correction, AMSGrad); the stateless transforms against
numbers by hand. Written to kill the mutants the mutation run left (docs/testing.md).
"""

import pytest
import torch

from fedforge.client.transforms import (
    RoundContext,
    adam,
    add_correction,
    add_decayed_weights,
    add_prox,
    at_round,
    chain,
    clip_by_global_norm,
    clip_statistics,
    identity,
    scale,
    scale_by_adam,
    scale_by_learning_rate,
    sgd,
    trace,
)

F64 = torch.float64
A = torch.tensor([1.0, 3.0, 0.5], dtype=F64)
B = torch.tensor([2.0, -1.0, 4.0], dtype=F64)
X0 = torch.tensor([0.5, 0.25, -1.0], dtype=F64)
EXP = {"kind": "exponential", "init": 0.2, "gamma": 0.5}  # 0.2 * 0.5**t


def ctx(round_=1.0, broadcast=None, client_state=None, global_params=None):
    return RoundContext(global_params or {"w": X0.clone()},
                        {"round": torch.tensor(round_, dtype=F64), **(broadcast or {})},
                        client_state or {}, {})


def grad(x):
    return A * (x - B)


def run_tx(tx, steps=4, c=None):
    """Iterates of ``x <- x + tx(grad(x))`` from X0 and the final state."""
    c = c or ctx()
    x = {"w": X0.clone()}
    state = tx.init(x, c)
    xs = []
    for _ in range(steps):
        upd, state = tx.update({"w": grad(x["w"])}, state, x, c)
        x = {"w": x["w"] + upd["w"]}
        xs.append(x["w"])
    return xs, state


def run_torch(opt_cls, steps=4, **kw):
    x = X0.clone().requires_grad_(True)
    opt = opt_cls([x], **kw)
    xs = []
    for _ in range(steps):
        opt.zero_grad()
        (0.5 * (A * (x - B) ** 2).sum()).backward()
        opt.step()
        xs.append(x.detach().clone())
    return xs


def assert_path(got, want):
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-14, msg=f"step {k + 1}")


# ----------------------------------------------------------------------------- SGD
@pytest.mark.parametrize("kw", [
    {},
    {"momentum": 0.9},
    {"momentum": 0.5, "nesterov": True},
    {"weight_decay": 0.1},
    {"momentum": 0.7, "weight_decay": 0.05},
    {"momentum": 0.7, "weight_decay": 0.05, "nesterov": True},
])
def test_sgd_equals_torch_sgd(kw):
    got, state = run_tx(sgd(0.1, **kw))
    assert_path(got, run_torch(torch.optim.SGD, lr=0.1, **kw))
    expect = {"lr"} | ({"momentum"} if kw.get("momentum") else set()) | (
        {"weight_decay"} if kw.get("weight_decay") else set())
    assert set(state) == expect  # the state layout (checkpoints) names every stage


def test_sgd_schedules_read_the_round():
    """lr and weight decay as schedules: round 2 uses 0.2·0.5² = 0.05 for both."""
    got, _ = run_tx(sgd(EXP, weight_decay=EXP), steps=1, c=ctx(2.0))
    g = grad(X0) + 0.05 * X0
    torch.testing.assert_close(got[0], X0 - 0.05 * g, rtol=1e-14, atol=0)


def test_trace_heavy_ball_and_nesterov_by_hand():
    """m1 = g1, m2 = 0.5 m1 + g2; Nesterov returns g + 0.5 m."""
    c, x = ctx(), {"w": X0}
    g1, g2 = {"w": torch.ones(3, dtype=F64)}, {"w": torch.full((3,), 2.0, dtype=F64)}
    for nesterov, want1, want2 in [(False, 1.0, 2.5), (True, 1.5, 3.25)]:
        tx = trace(0.5, nesterov=True) if nesterov else trace(0.5)  # heavy ball by default
        assert tx.name == "momentum" and trace(0.5, name="mom2").name == "mom2"
        st = tx.init(x, c)
        assert set(st) == {"m"} and torch.equal(st["m"]["w"], torch.zeros(3, dtype=F64))
        o1, st = tx.update(g1, st, x, c)
        o2, st = tx.update(g2, st, x, c)
        torch.testing.assert_close(o1["w"], torch.full((3,), want1, dtype=F64))
        torch.testing.assert_close(o2["w"], torch.full((3,), want2, dtype=F64))
        torch.testing.assert_close(st["m"]["w"], torch.full((3,), 2.5, dtype=F64))


# ---------------------------------------------------------------------------- Adam
@pytest.mark.parametrize("kw", [
    {},
    {"amsgrad": True},
    {"weight_decay": 0.1},
    {"b1": 0.5, "b2": 0.9, "eps": 1e-3, "amsgrad": True, "weight_decay": 0.05},
])
def test_adam_equals_torch_adam(kw):
    kw = dict(kw)
    torch_kw = {"lr": 0.1, "amsgrad": kw.get("amsgrad", False),
                "betas": (kw.get("b1", 0.9), kw.get("b2", 0.999)), "eps": kw.get("eps", 1e-8),
                "weight_decay": kw.get("weight_decay", 0.0)}
    got, state = run_tx(adam(0.1, **kw), steps=5)
    assert_path(got, run_torch(torch.optim.Adam, steps=5, **torch_kw))
    inner = state["adam"]
    assert inner["count"].item() == 5 and inner["count"].dtype == F64
    assert ("vhat" in inner) == kw.get("amsgrad", False)
    assert ("weight_decay" in state) == bool(kw.get("weight_decay"))


def test_scale_by_adam_without_bias_correction_by_hand():
    """FAdamGC's form: m/(sqrt(v)+eps) with m, v not corrected. One step with g = 2:
    m = 0.1·2 = 0.2, v = 0.01·4 = 0.04, direction 0.2/(0.2 + 0.1) = 2/3. A carried v_i = 0.32
    (initial_v) starts v and v̂: v = 0.99·0.32 + 0.01·4 = 0.3568 becomes v̂; a zero gradient
    then lowers v below v̂, and v̂ keeps dividing."""
    c = ctx(client_state={"v": {"w": torch.full((3,), 0.32, dtype=F64)}})
    x, g = {"w": X0}, {"w": torch.full((3,), 2.0, dtype=F64)}
    plain = scale_by_adam(0.9, 0.99, 0.1, bias_correction=False)
    out, st = plain.update(g, plain.init(x, c), x, c)
    torch.testing.assert_close(out["w"], torch.full((3,), 2 / 3, dtype=F64))
    carried = scale_by_adam(0.9, 0.99, 0.1, amsgrad=True, bias_correction=False,
                            initial_v=lambda c: c.client_state["v"])
    st = carried.init(x, c)
    torch.testing.assert_close(st["vhat"]["w"], torch.full((3,), 0.32, dtype=F64))
    out, st = carried.update(g, st, x, c)
    v = 0.99 * 0.32 + 0.01 * 4
    torch.testing.assert_close(st["v"]["w"], torch.full((3,), v, dtype=F64))
    torch.testing.assert_close(out["w"], torch.full((3,), 0.2 / (v**0.5 + 0.1), dtype=F64))
    # a smaller gradient lowers v below the running max, which then divides
    out2, st2 = carried.update({"w": torch.zeros(3, dtype=F64)}, st, x, c)
    torch.testing.assert_close(st2["vhat"]["w"], torch.full((3,), v, dtype=F64))
    torch.testing.assert_close(out2["w"], torch.full((3,), 0.18 / (v**0.5 + 0.1), dtype=F64))


def test_scale_by_adam_defaults_and_eps_schedule():
    """Defaults β1 0.9, β2 0.999, ε 1e-8 with bias correction: the first step is
    g/(|g| + ε) exactly; an ε schedule is read at the round."""
    c, x = ctx(), {"w": X0}
    tx = scale_by_adam()
    assert tx.name == "adam"
    g = {"w": torch.tensor([1e-6, 2.0, -3.0], dtype=F64)}
    out, st = tx.update(g, tx.init(x, c), x, c)
    torch.testing.assert_close(out["w"], g["w"] / (g["w"].abs() + 1e-8), rtol=1e-10, atol=0)
    torch.testing.assert_close(st["v"]["w"], 0.001 * g["w"] ** 2)
    torch.testing.assert_close(st["m"]["w"], 0.1 * g["w"])
    assert "vhat" not in st  # no AMSGrad by default
    sched = scale_by_adam(eps=EXP, name="a2")
    assert sched.name == "a2"
    c2 = ctx(2.0)
    out, _ = sched.update(g, sched.init(x, c2), x, c2)
    torch.testing.assert_close(out["w"], g["w"] / (g["w"].abs() + 0.05), rtol=1e-12, atol=0)


# ----------------------------------------------------------------- stateless transforms
def _apply(tx, g, c=None, x=None):
    c = c or ctx()
    x = x or {"w": X0}
    st = tx.init(x, c)
    assert st == {}
    out, st2 = tx.update({"w": g}, st, x, c)
    assert st2 == {}
    return out["w"]


def test_stateless_transforms_by_hand():
    g = torch.tensor([1.0, -2.0, 3.0], dtype=F64)
    assert identity().name == "identity"
    torch.testing.assert_close(_apply(identity(), g), g)
    assert scale(3.0).name == "scale" and scale(3.0, name="s2").name == "s2"
    torch.testing.assert_close(_apply(scale(3.0), g), 3 * g)
    torch.testing.assert_close(_apply(scale(EXP), g, ctx(3.0)), 0.025 * g)
    assert scale_by_learning_rate(0.1).name == "lr"
    torch.testing.assert_close(_apply(scale_by_learning_rate(0.1), g), -0.1 * g)
    torch.testing.assert_close(_apply(scale_by_learning_rate(EXP), g, ctx(1.0)), -0.1 * g)
    assert add_decayed_weights(0.1).name == "weight_decay"
    torch.testing.assert_close(_apply(add_decayed_weights(0.1), g), g + 0.1 * X0)
    torch.testing.assert_close(_apply(add_decayed_weights(EXP), g, ctx(2.0)), g + 0.05 * X0)
    # prox: g + mu (x - x^t) with x^t the broadcast model
    x = {"w": X0 + 1.0}
    assert add_prox(0.5).name == "prox"
    torch.testing.assert_close(_apply(add_prox(0.5), g, x=x), g + 0.5)
    # correction: g + c - c_i, read from the broadcast and the client's state
    c = ctx(broadcast={"p": {"c": {"w": torch.full((3,), 2.0, dtype=F64)}}},
            client_state={"p": {"ci": {"w": torch.full((3,), 0.5, dtype=F64)}}})
    corr = add_correction("p", "c", "ci")
    assert corr.name == "correction_p"
    torch.testing.assert_close(_apply(corr, g, c), g + 1.5)


def _clip(tx, g, c=None):
    c = c or ctx()
    x = {"w": X0}
    out, _ = tx.update({"w": g}, tx.init(x, c), x, c)
    return out["w"]


def test_clip_by_global_norm():
    g = torch.tensor([3.0, 4.0, 0.0], dtype=F64)  # norm 5
    assert clip_by_global_norm(1.0).name == "clip"
    torch.testing.assert_close(_clip(clip_by_global_norm(2.5), g), g / 2, rtol=1e-7, atol=0)
    torch.testing.assert_close(_clip(clip_by_global_norm(10.0), g), g)  # below: unchanged
    torch.testing.assert_close(_clip(clip_by_global_norm(EXP), g, ctx(1.0)), g / 50,
                               rtol=1e-7, atol=0)
    zero = torch.zeros(3, dtype=F64)
    torch.testing.assert_close(_clip(clip_by_global_norm(1.0), zero), zero)
    tiny = torch.tensor([1e-13, 0.0, 0.0], dtype=F64)  # far below the norm: unchanged
    torch.testing.assert_close(_clip(clip_by_global_norm(1.0), tiny), tiny, rtol=0, atol=0)


def test_clip_counts_clipped_steps_and_pre_clip_norms():
    """Steps of norm 5 (clipped at 4), 4 (at the bound: not clipped) and 1 -> 1/3 clipped,
    mean pre-clip norm 10/3; the counters are the state's, so masked steps do not count."""
    tx = clip_by_global_norm(4.0)
    x, c = {"w": X0}, ctx()
    st = tx.init(x, c)
    for g in ([3.0, 4.0, 0.0], [0.0, 4.0, 0.0], [1.0, 0.0, 0.0]):
        _, st = tx.update({"w": torch.tensor(g, dtype=F64)}, st, x, c)
    assert float(st["clipped"]) == 1.0 and float(st["norm_sum"]) == pytest.approx(10.0)
    nested = {"chain": {"decay": {}, "clip": st}}
    stats = clip_statistics(nested, torch.tensor(3.0, dtype=F64))
    assert float(stats["clip_fraction"]) == pytest.approx(1 / 3)
    assert float(stats["clip_norm"]) == pytest.approx(10 / 3)
    assert clip_statistics({"lr": {}}, torch.tensor(3.0)) == {}


def test_chain_order_state_and_duplicates():
    g = torch.tensor([3.0, 4.0, 0.0], dtype=F64)
    # order matters: clip then decay vs decay then clip
    a = _apply_chain(chain(clip_by_global_norm(1.0), add_decayed_weights(1.0)), g)
    b = _apply_chain(chain(add_decayed_weights(1.0), clip_by_global_norm(1.0)), g)
    torch.testing.assert_close(a, g / 5 + X0, rtol=1e-7, atol=0)
    torch.testing.assert_close(b, (g + X0) / (g + X0).norm(), rtol=1e-7, atol=0)
    tx = chain(trace(0.5), scale_by_learning_rate(1.0))
    assert tx.name == "chain"
    assert set(tx.init({"w": X0}, ctx())) == {"momentum", "lr"}
    with pytest.raises(ValueError, match="unique"):
        chain(scale(1.0), scale(2.0))


def _apply_chain(tx, g):
    c, x = ctx(), {"w": X0}
    out, _ = tx.update({"w": g}, tx.init(x, c), x, c)
    return out["w"]


def test_round_context():
    c = ctx(4.0)
    assert c.round.item() == 4.0
    assert at_round(0.3, c) == 0.3
    assert float(at_round(EXP, c)) == pytest.approx(0.2 * 0.5**4)


def test_adam_without_bias_correction():
    """adam(..., bias_correction=False): the first step is lr (1-β1) g/(sqrt(1-β2)|g| + ε)
    (with the correction it would be lr g/(|g| + ε))."""
    (x1,), _ = run_tx(adam(0.1, 0.9, 0.99, 0.1, bias_correction=False), steps=1)
    g = grad(X0)
    torch.testing.assert_close(x1, X0 - 0.1 * 0.1 * g / (0.1 * g.abs() + 0.1), rtol=1e-12,
                               atol=0)


def test_chain_passes_the_round_context_to_init():
    """A chained transform that starts from the client's state (FAdamGC's carried v_i)."""
    c = ctx(client_state={"v": {"w": torch.full((3,), 0.5, dtype=F64)}})
    tx = chain(scale_by_adam(initial_v=lambda c: c.client_state["v"]), scale(1.0))
    st = tx.init({"w": X0}, c)
    torch.testing.assert_close(st["adam"]["v"]["w"], torch.full((3,), 0.5, dtype=F64))


@pytest.mark.parametrize("make,field", [
    (lambda bad: scale(bad, name="factor"), "factor"),
    (scale_by_learning_rate, "lr"),
    (add_decayed_weights, "weight_decay"),
    (clip_by_global_norm, "max_grad_norm"),
    (lambda bad: scale_by_adam(eps=bad), "eps"),
    (lambda bad: sgd(0.1, weight_decay=bad), "weight_decay"),
    (lambda bad: adam(0.1, weight_decay=bad), "weight_decay"),
])
def test_bad_hyper_parameters_name_their_field(make, field):
    with pytest.raises(ValueError, match=f"^{field}: expected a number or a schedule"):
        make(True)


@pytest.mark.parametrize("lr", [0.1, EXP], ids=["constant", "schedule"])
@pytest.mark.parametrize("make", [sgd, lambda lr: sgd(lr, momentum=0.9, weight_decay=0.1),
                                  adam, lambda lr: chain(identity(), scale(2.0))],
                         ids=["sgd", "sgd_momentum_wd", "adam", "no_fused_step"])
def test_local_step_is_params_plus_updates(lr, make):
    """The fused step (the learning rate folded into the addition) is ``params + updates``
    of the same transform, with the same new state, over three steps."""
    from fedforge.client.transforms import local_step

    opt = make(lr)
    c = ctx(round_=2.0)
    params = {"w": X0.clone()}
    state = opt.init(params, c)
    for grads in ({"w": A}, {"w": B}, {"w": A - B}):
        updates, want_state = opt.update(grads, state, params, c)
        new_params, state = local_step(opt, grads, state, params, c)
        torch.testing.assert_close(new_params["w"], params["w"] + updates["w"], rtol=1e-15,
                                   atol=1e-15)
        torch.testing.assert_close(state, want_state, rtol=0, atol=0)
        params = new_params
