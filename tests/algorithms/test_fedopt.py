"""FedAdam / FedYogi / FedAdagrad / FedAMS against numbers worked out by hand, and a
plain-float reference for later rounds (one client, one local SGD step, 1-D problem).

Only the model is compared (the server state's layout is an implementation detail); every
server moment shows in the model of the round after it changes.
"""

import math

import pytest

from fedforge.algorithms import build_algorithm
from tests.quadratic import run_rounds

LOCAL_LR, SERVER_LR, B1, B2, TAU = 0.1, 0.01, 0.9, 0.99, 1e-3
ROW = [[1.0, 1.0, 0.0]]  # a = 1, b = (1, 0): 1-D problem in the first coordinate


def _fedopt(name, **kw):
    if name != "fedadagrad":
        kw.setdefault("b1", B1)
        kw.setdefault("b2", B2)
    if name != "fedams":
        kw.setdefault("tau", TAU)
    return build_algorithm(name, local_lr=kw.pop("local_lr", LOCAL_LR),
                           server_lr=kw.pop("server_lr", SERVER_LR), **kw)


def _models(algo, rounds):
    _, _, _, hist = run_rounds(algo, ROW, [0.0, 0.0], rounds=rounds)
    for params, _, _ in hist:
        assert params["w"][1].item() == 0.0  # the second coordinate stays at its optimum
    return [params["w"][0].item() for params, _, _ in hist]


@pytest.mark.parametrize("name,x1", [
    # Δ = x - x_i = 0 - 0.1 = -0.1 in round 1 (x_i = 0 - 0.1 (0 - 1) = 0.1)
    # FedAdam: m = 0.1·(-0.1) = -0.01, v = 0.01·0.01 = 1e-4, x = 0.01·0.01/(0.01 + 0.001)
    ("fedadam", 1 / 110),
    # FedYogi: v = 0 - 0.01·0.01·sign(0 - 0.01) = +1e-4: the same first step as Adam
    ("fedyogi", 1 / 110),
    # FedAdagrad (β1 = 0): m = -0.1, v = 0.01, x = 0.01·0.1/(0.1 + 0.001)
    ("fedadagrad", 1 / 101),
])
def test_first_round_by_hand(name, x1):
    assert _models(_fedopt(name), 1)[0] == pytest.approx(x1, rel=1e-12)


def reference(kind: str, rounds: int):
    """Reddi et al. 2021, Alg. 2, written out for the 1-D client (no bias correction)."""
    x, m, v, out = 0.0, 0.0, 0.0, []
    for _ in range(rounds):
        delta = LOCAL_LR * (x - 1.0)  # x - (x - lr (x - 1))
        m = delta if kind == "adagrad" else B1 * m + (1 - B1) * delta
        if kind == "adam":
            v = B2 * v + (1 - B2) * delta**2
        elif kind == "yogi":
            v = v - (1 - B2) * delta**2 * math.copysign(1.0, v - delta**2)
        else:
            v = v + delta**2
        x = x - SERVER_LR * m / (math.sqrt(v) + TAU)
        out.append(x)
    return out


@pytest.mark.parametrize("name,kind", [("fedadam", "adam"), ("fedyogi", "yogi"),
                                       ("fedadagrad", "adagrad")])
def test_three_rounds_match_reference(name, kind):
    got = _models(_fedopt(name), 3)
    assert got == pytest.approx(reference(kind, 3), rel=1e-10)
    if kind == "yogi":  # Yogi's additive v differs from Adam's from round 2 on
        assert got[1] != pytest.approx(reference("adam", 3)[1], rel=1e-6)


@pytest.mark.parametrize("floor,x1,x2", [
    # local lr 0.5: Δ = 0.5 (x - 1); β1 = β2 = 0.5, η = 1.
    # round 1: Δ = -1/2, m = -1/4, v = 1/8 > floor 0.01: v̂ = 1/8, x1 = (1/4)·√8 = √2/2.
    # round 2: Δ = (√2 - 2)/4, m = -1/8 + Δ/2 = (√2 - 3)/8, v = 1/16 + Δ²/2 ≈ 0.0732 < 1/8:
    #   the running max keeps v̂ = 1/8, so x2 = √2/2 - m·√8 = (5√2 - 2)/4.
    (0.01, math.sqrt(2) / 2, (5 * math.sqrt(2) - 2) / 4),
    # floor 0.5 above every v: v̂ = 1/2 in both rounds.
    # round 1: x1 = (1/4)/√(1/2) = √2/4; round 2: Δ = (√2 - 4)/8, m = (√2 - 6)/16,
    #   x2 = √2/4 - m·√2 = (10√2 - 2)/16.
    (0.5, math.sqrt(2) / 4, (10 * math.sqrt(2) - 2) / 16),
])
def test_fedams_running_max_and_floor_by_hand(floor, x1, x2):
    """FedAMS (Wang et al. 2022, Alg. 2): v̂ = max(v̂, v, ε), x <- x - η m/√v̂."""
    algo = _fedopt("fedams", local_lr=0.5, server_lr=1.0, b1=0.5, b2=0.5, eps=floor)
    assert _models(algo, 2) == pytest.approx([x1, x2], rel=1e-12)
