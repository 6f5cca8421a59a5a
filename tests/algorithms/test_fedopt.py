"""FedAdam / FedYogi / FedAdagrad / FedAMS server state after two rounds vs a plain-float
reference written independently of the library (one client, one local SGD step)."""

import math

import pytest
import torch

from fedforge.algorithms import build_algorithm
from tests.quadratic import run_rounds

LOCAL_LR, SERVER_LR, B1, B2, TAU = 0.1, 0.01, 0.9, 0.99, 1e-3


def reference(kind: str, rounds: int = 2):
    """Client: a=1, b=1 (1-D); x <- x - 0.1 (x - 1) locally; server gets Δ = x - x_i."""
    x, m, v, vhat = 0.0, 0.0, 0.0, 0.0
    history = []
    for _ in range(rounds):
        delta = x - (x - LOCAL_LR * (x - 1.0))  # pseudo-gradient
        m = B1 * m + (1 - B1) * delta if kind != "adagrad" else delta
        if kind in ("adam", "ams"):
            v = B2 * v + (1 - B2) * delta**2
        elif kind == "yogi":
            v = v - (1 - B2) * delta**2 * math.copysign(1.0, v - delta**2)
        else:
            v = v + delta**2
        if kind == "ams":
            vhat = max(vhat, v, 1e-8)
            x = x - SERVER_LR * m / math.sqrt(vhat)
        else:
            x = x - SERVER_LR * m / (math.sqrt(v) + TAU)
        history.append((x, m, v))
    return history


@pytest.mark.parametrize(
    "name,kind",
    [("fedadam", "adam"), ("fedyogi", "yogi"), ("fedadagrad", "adagrad"), ("fedams", "ams")],
)
def test_server_state_after_two_rounds(name, kind):
    kwargs = {"local_lr": LOCAL_LR, "server_lr": SERVER_LR}
    if name != "fedadagrad":
        kwargs["b1"], kwargs["b2"] = B1, B2
    if name != "fedams":
        kwargs["tau"] = TAU
    algo = build_algorithm(name, **kwargs)
    # 1-D problem embedded in the first coordinate; second coordinate stays at its optimum 0
    _, _, _, hist = run_rounds(algo, [[1.0, 1.0, 0.0]], [0.0, 0.0], rounds=2)
    for (params, server_state, _), (x, m, v) in zip(hist, reference(kind)):
        opt = server_state["opt"]
        assert params["w"][0].item() == pytest.approx(x, rel=1e-10)
        assert opt["m"]["w"][0].item() == pytest.approx(m, rel=1e-10)
        assert opt["v"]["w"][0].item() == pytest.approx(v, rel=1e-10)
        assert params["w"][1].item() == 0.0


def test_fedams_keeps_running_max():
    algo = build_algorithm("fedams", local_lr=LOCAL_LR, server_lr=SERVER_LR)
    _, state, _, _ = run_rounds(algo, [[1.0, 1.0, 0.0]], [0.0, 0.0], rounds=3)
    opt = state["opt"]
    assert torch.all(opt["vhat"]["w"] >= opt["v"]["w"])
