"""Uplink diagnostics by hand: the relative decode error and the top-k energy of a window."""

from __future__ import annotations

import math

import pytest
import torch

from fedforge.algorithms import build_algorithm
from fedforge.algorithms.uplink_diagnostics import UplinkDiagnostics
from fedforge.comm.sketch import CountSketch, relative_error, topk_energy
from fedforge.server.chain import Aggregate


def test_relative_error_by_hand():
    """Δ = (3, 4), ||Δ|| = 5; u = (3, 0): ||u - Δ|| = 4 -> 0.8."""
    err = relative_error(torch.tensor([3.0, 0.0]), torch.tensor([3.0, 4.0]))
    assert float(err) == pytest.approx(0.8)


def test_one_bucket_count_sketch_error_is_sqrt_d_minus_one():
    """One row, one bucket: y = Σ s_j v_j, desk_j = s_j y. For v = e_0, |desk_j| = 1 for every
    j, so u - v has d - 1 entries ±1 and ||u - v|| / ||v|| = sqrt(d - 1) = 2 for d = 5."""
    op = CountSketch(5, cols=1, rows=1, seed=3)
    v = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0])
    u = op.desketch(op.sketch(v, 7), 7)
    assert u.abs().tolist() == [1.0] * 5
    assert float(relative_error(u, v)) == pytest.approx(2.0)


def test_rank_one_window_has_all_energy_in_the_top_direction():
    a = torch.tensor([1.0, -2.0, 0.5, 3.0])
    window = torch.stack([a, -2 * a, 0.5 * a])  # rank 1
    top1, top2 = topk_energy(window, (1, 2))
    assert float(top1) == pytest.approx(1.0) and float(top2) == pytest.approx(1.0)


def test_orthogonal_window_energy_by_hand():
    """Rows 3 e_0, 1 e_1 (orthogonal): singular values 3, 1 -> top-1 share 9 / 10."""
    window = torch.tensor([[3.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    top1, top5 = topk_energy(window, (1, 5))
    assert float(top1) == pytest.approx(0.9) and float(top5) == pytest.approx(1.0)


def test_part_logs_error_and_window_energy_from_the_true_mean_delta():
    """Window 2: after Δ_1 = (3, 4) decoded as (3, 0) and Δ_2 = (0, 5) decoded exactly, the
    last error is 0, the mean (0.8 + 0) / 2 = 0.4; rows (3, 4), (0, 5): W W^T = [[25, 20],
    [20, 25]], eigenvalues 45 and 5 -> top-1 share 0.9."""
    part = UplinkDiagnostics(2)
    params = {"w": torch.zeros(2)}
    state = part.server_init(params)
    assert part.server_metrics(state, {}) == {}
    for true, decoded in (([3.0, 4.0], [3.0, 0.0]), ([0.0, 5.0], [0.0, 5.0])):
        agg = Aggregate({"w": torch.tensor(decoded)}, {}, 2, 2, 1)
        state = part.server_update(state, {"delta": torch.tensor(true)}, agg)
    m = {k: float(v) for k, v in part.server_metrics(state, {}).items()}
    assert m["desketch_rel_err"] == pytest.approx(0.0)
    assert m["desketch_rel_err_mean"] == pytest.approx(0.4)
    assert m["delta_energy_top1"] == pytest.approx(0.9)
    assert m["delta_energy_top5"] == pytest.approx(1.0)


def test_window_keeps_the_last_w_deltas():
    part = UplinkDiagnostics(1)
    state = part.server_init({"w": torch.zeros(2)})
    for v in ([1.0, 0.0], [0.0, 2.0]):
        agg = Aggregate({"w": torch.tensor(v)}, {}, 1, 1, 1)
        state = part.server_update(state, {"delta": torch.tensor(v)}, agg)
    assert state["window"].tolist() == [[0.0, 2.0]] and int(state["filled"]) == 2


@pytest.mark.parametrize("name", ["safl", "fetchsgd", "topk_ef", "marina"])
def test_compressed_algorithms_take_the_window_and_keep_bytes(name):
    params = {"w": torch.zeros(1000)}
    plain, diag = build_algorithm(name), build_algorithm(name, diagnostics_window=3)
    assert [p.name for p in diag.parts] == ["uplink_diag"] and not plain.parts
    assert diag.message_nbytes(params, diag.server_init(params), 2) == plain.message_nbytes(
        params, plain.server_init(params), 2)  # the diagnostic channel is not billed
    with pytest.raises(ValueError, match="algorithm.diagnostics_window"):
        UplinkDiagnostics(0)


def test_srht_error_in_a_run_is_near_sqrt_compression(tmp_path):
    """One SRHT desketch of b = d/10 numbers has E||u - Δ||² ≈ (d/b - 1)||Δ||²: error ≈ 3."""
    from fedforge.experiment.config import validate
    from fedforge.experiment.runner import run_experiment

    cfg = validate({
        "seed": 0, "rounds": 2,
        "data": {"dataset": "synthetic", "partition": "natural",
                 "options": {"num_clients": 3}},
        "model": {"name": "logreg"},
        "algorithm": {"name": "safl", "compression": 10.0, "diagnostics_window": 2},
        "client": {"batch_size": 8, "local_steps": 2},
        "server": {"clients_per_round": 3}, "eval": {"every": 1},
    })
    hist = run_experiment(cfg, tmp_path / "r", progress=False)
    assert abs(hist[-1]["desketch_rel_err"] - math.sqrt(9.0)) < 1.0
    assert hist[0]["delta_energy_top1"] == pytest.approx(1.0)  # one delta: rank one
