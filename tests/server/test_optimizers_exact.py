"""Exact checks of the server optimizers (src/fedforge/server/optimizers.py): the steps they
return for a fixed sequence of pseudo-gradients, against the update rules written out here
(Reddi et al. 2021, Alg. 2; Hsu et al. 2019; Wang et al. 2022; the FedNAR code's FedAdam).
Defaults, schedules read at the right round, and the error for an unknown rule are pinned.
Written to kill the mutants the mutation run left (docs/testing.md).
"""

import math

import pytest
import torch

from fedforge.server.optimizers import server_adagrad, server_adam, server_sgd, server_yogi

F64 = torch.float64
GS = [[0.2, -0.1], [0.05, 0.3], [-0.4, 0.0]]  # Δ of three rounds (one coordinate 0 once)
EXP = {"kind": "exponential", "init": 0.4, "gamma": 0.5}  # 0.4 · 0.5^t


def steps(opt, gs=GS, x0=(1.0, -1.0)):
    """The updates an optimizer returns for the Δ sequence ``gs`` (state threaded)."""
    params = {"w": torch.tensor(x0, dtype=F64)}
    state, out = opt.init(params), []
    for g in gs:
        upd, state = opt.update({"w": torch.tensor(g, dtype=F64)}, state, params)
        params = {"w": params["w"] + upd["w"]}
        out.append(upd["w"])
    return out


def check(got, want):
    assert len(got) == len(want)
    for t, (a, b) in enumerate(zip(got, want), start=1):
        torch.testing.assert_close(a, torch.tensor(b, dtype=F64), rtol=1e-12, atol=1e-15,
                                   msg=f"update {t}")


def adaptive_ref(kind, lr, b1, b2, tau, v0=0.0, amsgrad=False, floor=None, gs=GS):
    m, v, vh, out = [0.0, 0.0], [v0, v0], [v0, v0], []
    for t, g in enumerate(gs, start=1):
        eta = lr(t) if callable(lr) else lr
        eps = tau(t) if callable(tau) else tau
        step = []
        for j in range(2):
            m[j] = b1 * m[j] + (1 - b1) * g[j]
            if kind == "adam":
                v[j] = b2 * v[j] + (1 - b2) * g[j] ** 2
            elif kind == "yogi":
                d = v[j] - g[j] ** 2
                v[j] = v[j] - (1 - b2) * g[j] ** 2 * (0.0 if d == 0 else math.copysign(1, d))
            elif kind == "adagrad":
                v[j] = v[j] + g[j] ** 2
            else:  # fednar_code
                v[j] = b2 * v[j] + (1 - b2) * m[j] ** 2
            denom = max(vh[j], v[j]) if amsgrad else v[j]
            if floor is not None:
                denom = max(denom, floor)
            vh[j] = denom
            if kind == "fednar_code":
                step.append(-eta * (m[j] / (1 - b1)) / math.sqrt(v[j] / (1 - b2) + eps))
            elif floor is not None:
                step.append(-eta * m[j] / math.sqrt(denom))
            else:
                step.append(-eta * m[j] / (math.sqrt(denom) + eps))
        out.append(step)
    return out


# ---------------------------------------------------------------------------- SGD
def test_sgd_default_is_fedavg():
    opt = server_sgd()
    assert opt.name == "sgd"
    check(steps(opt), [[-a, -b] for a, b in GS])
    assert opt.init({"w": torch.zeros(2)}) == {}  # no momentum buffer, no round clock


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_momentum(nesterov):
    """v = β v + Δ; step -η v (Nesterov: -η (Δ + β v))."""
    beta, lr, v, want = 0.5, 0.7, [0.0, 0.0], []
    for g in GS:
        v = [beta * v[j] + g[j] for j in range(2)]
        d = [g[j] + beta * v[j] for j in range(2)] if nesterov else v
        want.append([-lr * x for x in d])
    opt = server_sgd(lr, beta, nesterov=True) if nesterov else server_sgd(lr, beta)
    check(steps(opt), want)


def test_sgd_lr_schedule_reads_rounds_1_2_3():
    check(steps(server_sgd(EXP)), [[-0.4 * 0.5**t * x for x in g] for t, g in
                                   enumerate(GS, start=1)])


# --------------------------------------------------------------------------- Adam
def test_adam_defaults():
    """lr 1e-2, β1 0.9, β2 0.99, τ 1e-3, no bias correction (Reddi et al. 2021)."""
    opt = server_adam()
    assert opt.name == "adam"
    check(steps(opt), adaptive_ref("adam", 1e-2, 0.9, 0.99, 1e-3))


@pytest.mark.parametrize("kw,ref", [
    ({"amsgrad": True}, {"amsgrad": True}),
    ({"amsgrad": True, "floor": 0.02}, {"amsgrad": True, "floor": 0.02}),
    ({"floor": 0.01}, {"floor": 0.01}),
    ({"initial_accumulator": 0.05}, {"v0": 0.05}),
    ({"initial_accumulator": 0.05, "amsgrad": True}, {"v0": 0.05, "amsgrad": True}),
])
def test_adam_variants(kw, ref):
    check(steps(server_adam(0.3, 0.6, 0.8, 0.01, **kw)),
          adaptive_ref("adam", 0.3, 0.6, 0.8, 0.01, **ref))


def test_adam_schedules_read_rounds_1_2_3():
    def lr(t):
        return 0.4 * 0.5**t

    def tau(t):
        return 0.01 * 0.25**t

    opt = server_adam(EXP, 0.6, 0.8, {"kind": "exponential", "init": 0.01, "gamma": 0.25})
    check(steps(opt), adaptive_ref("adam", lr, 0.6, 0.8, tau))


def test_adam_fednar_code_rule():
    """m = β1 m + (1-β1) Δ; v = β2 v + (1-β2) m²; step -η (m/(1-β1))/sqrt(v/(1-β2) + ε)."""
    check(steps(server_adam(0.1, 0.9, 0.99, 0.01, rule="fednar_code")),
          adaptive_ref("fednar_code", 0.1, 0.9, 0.99, 0.01))
    with pytest.raises(ValueError, match=r"^adam_rule: expected 'textbook' or 'fednar_code', "
                                         r"got 'torch'$"):
        server_adam(rule="torch")


# ------------------------------------------------------------------- Yogi, Adagrad
def test_yogi_defaults_and_sign_rule():
    opt = server_yogi()
    assert opt.name == "yogi"
    check(steps(opt), adaptive_ref("yogi", 1e-2, 0.9, 0.99, 1e-3))
    # v0 = 0.04 = Δ² for the first coordinate: sign 0 keeps v; the second grows
    gs = [[0.2, 0.5], [0.2, 0.5]]
    check(steps(server_yogi(0.1, 0.5, 0.9, 0.01, initial_accumulator=0.04), gs),
          adaptive_ref("yogi", 0.1, 0.5, 0.9, 0.01, v0=0.04, gs=gs))


def test_adagrad_defaults_and_momentum():
    opt = server_adagrad()
    assert opt.name == "adagrad"
    check(steps(opt), adaptive_ref("adagrad", 1e-2, 0.0, 0.0, 1e-3))  # β1 = 0: m = Δ
    check(steps(server_adagrad(0.2, 0.05, b1=0.5, initial_accumulator=0.1)),
          adaptive_ref("adagrad", 0.2, 0.5, 0.0, 0.05, v0=0.1))


def test_constant_hyper_parameters_keep_no_round_counter():
    """A schedule makes the optimizer count its updates; constants do not (old states load)."""
    params = {"w": torch.zeros(2, dtype=F64)}
    assert "count" not in server_adam().init(params)
    assert server_adam(EXP).init(params)["count"].item() == 0.0
    assert server_sgd(EXP).init(params)["count"].dtype == F64
    state = server_sgd(EXP).init(params)
    for t in range(1, 4):
        _, state = server_sgd(EXP).update({"w": torch.ones(2, dtype=F64)}, state, params)
        assert state["count"].item() == t


def test_schedules_with_momentum_fednar_rule_and_tau_alone():
    """The round clock ticks on every path: server momentum, the FedNAR rule with a decaying
    ε (as in its code), and a schedule on τ alone."""
    beta, v, want = 0.5, [0.0, 0.0], []
    for t, g in enumerate(GS, start=1):
        v = [beta * v[j] + g[j] for j in range(2)]
        want.append([-0.4 * 0.5**t * x for x in v])
    check(steps(server_sgd(EXP, beta)), want)

    def eps(t):
        return 0.01 * 0.25**t

    decaying = {"kind": "exponential", "init": 0.01, "gamma": 0.25}
    check(steps(server_adam(0.1, 0.9, 0.99, decaying, rule="fednar_code")),
          adaptive_ref("fednar_code", 0.1, 0.9, 0.99, eps))
    check(steps(server_adam(0.3, 0.6, 0.8, decaying)), adaptive_ref("adam", 0.3, 0.6, 0.8, eps))


@pytest.mark.parametrize("make,field", [
    (lambda bad: server_sgd(bad), "server_lr"),
    (lambda bad: server_adam(bad), "server_lr"),
    (lambda bad: server_adam(0.1, tau=bad), "tau"),
    (lambda bad: server_yogi(tau=bad), "tau"),
])
def test_bad_hyper_parameters_name_their_field(make, field):
    with pytest.raises(ValueError, match=f"^{field}: expected a number or a schedule"):
        make(True)
