"""FAdamGC's tracking part (src/fedforge/algorithms/fadamgc.py): argument errors and the
tracking subset drawn from the round's generator only, the defaults, the diagnostics by
hand, and the full-gradient start (chunked full gradient, which clients join and on which
samples). Written to kill the mutants the mutation run left (docs/testing.md)."""

import pytest
import torch

from fedforge.algorithms.fadamgc import (
    GradientTracking,
    _grad_at,
    num_tracking,
    sample_tracking,
)
from fedforge.client.transforms import RoundContext
from fedforge.protocol.algorithm import FinalizeInputs, PrepareInputs


def test_errors_name_what_is_wrong():
    with pytest.raises(ValueError, match=r"^GradientTracking: mode must be 'gradient' or "):
        GradientTracking("t", "delta")
    with pytest.raises(ValueError, match=r"^GradientTracking\(mode='model_change'\) needs "
                                         r"local_lr$"):
        GradientTracking("t", "model_change", 0.5)
    with pytest.raises(ValueError, match=r"^algorithm.tracking_fraction: expected 0 <= f <= 1"):
        GradientTracking("t", "gradient", 1.5)


def test_tracking_subset_comes_from_the_round_generator():
    """Resumable runs redraw the same S̃ from (seed, round): the mask depends only on the
    generator handed to round_info."""
    part = GradientTracking("t", "gradient", 0.5)
    a = part.round_info(40, torch.Generator().manual_seed(1))["tracking"]
    torch.manual_seed(123)  # the global RNG must not matter
    b = part.round_info(40, torch.Generator().manual_seed(1))["tracking"]
    assert torch.equal(a, b) and int(a.sum()) == 20
    assert not torch.equal(a, part.round_info(40, torch.Generator().manual_seed(2))["tracking"])


@pytest.mark.parametrize("s,f,k", [(10, 0.0, 0), (10, 0.04, 1), (10, 0.25, 3), (10, 0.35, 4),
                                   (3, 0.5, 2), (2, 0.5, 1), (4, 1.0, 4)])
def test_number_of_trackers(s, f, k):
    assert num_tracking(s, f) == k
    assert int(sample_tracking(s, f, torch.Generator().manual_seed(0)).sum()) == k


# ------------------------------------------------------------ defaults, errors, diagnostics
F64 = torch.float64


def test_tracking_part_defaults():
    part = GradientTracking()
    assert (part.name, part.mode, part.fraction, part.init) == ("tracking", "gradient", 0.5,
                                                                 "zeros")
    assert part.local_lr is None and part.uplink_models == 0.5 and not part.prepares


def _fin(yi, y, grad_sum, steps, info, state_extra=None):
    state = {"y": {"w": torch.tensor(yi, dtype=F64)}, "count": torch.tensor(0.0, dtype=F64),
             **(state_extra or {})}
    ctx = RoundContext({}, {"round": torch.tensor(1.0), "tracking": {
        "y": {"w": torch.tensor(y, dtype=F64)}}}, {"tracking": state}, info)
    return FinalizeInputs(ctx, {"w": torch.zeros(2, dtype=F64)}, {}, {},
                          {"w": torch.tensor(grad_sum, dtype=F64)},
                          torch.tensor(float(steps), dtype=F64))


def test_missing_round_info_message():
    fin = _fin([0.0, 0.0], [0.0, 0.0], [0.0, 0.0], 1, {})
    with pytest.raises(KeyError, match=r"tracking: ctx\.info\['tracking'\] missing; pass "
                                       r"info=algorithm\.round_info\(num_sampled, generator\) "
                                       r"to the round"):
        GradientTracking().finalize(fin)


def test_client_metrics_divide_the_gradient_sum_by_k():
    """y - y_i = (3, 4): corr 5; two steps with Σ g = (6, 8): mean raw gradient norm 5."""
    fin = _fin([1.0, 1.0], [4.0, 5.0], [6.0, 8.0], 2, {"tracking": torch.tensor(True)})
    m = GradientTracking().client_metrics(fin)
    assert set(m) == {"tracking_corr_norm", "tracking_corr_rel"}
    assert m["tracking_corr_norm"].item() == pytest.approx(5.0, abs=1e-12)
    assert m["tracking_corr_rel"].item() == pytest.approx(1.0, abs=1e-12)


def test_server_metrics_by_hand():
    """Counts (0, 1, 2, 0): share tracked at least once 0.5 (a count of 1 counts), mean 0.75;
    y_i - y of norms 0, 5, 0, 10: mean deviation 3.75."""
    part = GradientTracking()
    assert part.server_metrics({"y": {"w": torch.zeros(2)}}, {}) == {}
    y = {"w": torch.tensor([1.0, 1.0], dtype=F64)}
    clients = {"y": {"w": torch.tensor([[1.0, 1.0], [4.0, 5.0], [1.0, 1.0], [7.0, 9.0]],
                                       dtype=F64)},
               "count": torch.tensor([0.0, 1.0, 2.0, 0.0], dtype=F64)}
    m = part.server_metrics({"y": y}, clients)
    assert set(m) == {"tracking_dev_all", "tracking_tracked_share", "tracking_tracked_mean"}
    assert m["tracking_tracked_share"].item() == 0.5
    assert m["tracking_tracked_mean"].item() == 0.75
    assert m["tracking_dev_all"].item() == pytest.approx(3.75, abs=1e-12)


def test_full_gradient_finalize_uploads_float_joined():
    part = GradientTracking(init="full_gradient")
    fin = _fin([2.0, 3.0], [0.0, 0.0], [0.0, 0.0], 1,
               {"tracking": torch.tensor(False), "tracking_fresh": torch.tensor(True)},
               {"ready": torch.tensor(1.0, dtype=F64)})
    state, up = part.finalize(fin)
    assert up["joined"].dtype == F64 and up["joined"].item() == 1.0
    assert up["g0"]["w"].tolist() == [2.0, 3.0]
    assert state["count"].dtype == F64 and state["count"].item() == 0.0


# -------------------------------------------------- full_gradient: the local full gradient
X_ALL = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0], [2.0, -1.0], [3.0, 1.0],
                      [-1.0, 4.0]], dtype=F64)
Y_ALL = torch.tensor([1.0, -2.0, 0.5, 3.0, 0.0, 1.0], dtype=F64)
X1 = {"w": torch.tensor([0.5, -1.0], dtype=F64)}


def _sq_loss(params, x, y, w):
    """Weighted mean of ½ (x·p - y)²; its per-sample gradient is (x·p - y) x."""
    r = x @ params["w"] - y
    return (w * 0.5 * r**2).sum() / w.sum()


def _mean_grad(idx):
    g = [(X_ALL[i] @ X1["w"] - Y_ALL[i]) * X_ALL[i] for i in idx]
    return torch.stack(g).mean(0)


def test_grad_at_in_chunks_is_the_mean_gradient():
    for chunk in (1, 2, 4, 1024):
        g = _grad_at(_sq_loss, X1, X_ALL[:5], Y_ALL[:5], chunk=chunk)
        torch.testing.assert_close(g["w"], _mean_grad(range(5)), rtol=1e-12, atol=1e-14)


def _prep(states, sample_idx, weights):
    return PrepareInputs(X1, {}, {"tracking": states}, {}, _sq_loss, X_ALL, Y_ALL,
                         torch.tensor(sample_idx), torch.tensor(weights, dtype=F64))


def test_prepare_cohort_sets_y_i_once_from_the_real_samples():
    """Cohort: client 0 already joined (kept), client 1 with a padded slot pointing at
    sample 0 (excluded), client 2 without data (kept, not joined), client 3 with one sample."""
    part = GradientTracking(init="full_gradient")
    with pytest.raises(RuntimeError, match=r"^tracking: server_init must run before "
                                           r"prepare_cohort$"):
        part.prepare_cohort(_prep({}, [[[0]]], [[[1.0]]]))
    part.server_init({"w": X1["w"].clone()})
    states = {"y": {"w": torch.tensor([[9.0, 9.0]] + [[0.0, 0.0]] * 3, dtype=F64)},
              "count": torch.zeros(4, dtype=F64),
              "ready": torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=F64)}
    sample_idx = [[[0, 1], [0, 2]], [[1, 2], [3, 0]], [[5, 5], [5, 5]], [[4, 4], [4, 4]]]
    weights = [[[1, 1], [1, 1]], [[1, 1], [1, 0]], [[0, 0], [0, 0]], [[1, 1], [0, 0]]]
    state, info, metrics = part.prepare_cohort(_prep(states, sample_idx, weights))
    y = state["y"]["w"]
    assert y[0].tolist() == [9.0, 9.0] and y[2].tolist() == [0.0, 0.0]
    torch.testing.assert_close(y[1], _mean_grad([1, 2, 3]), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(y[3], _mean_grad([4]), rtol=1e-12, atol=1e-14)
    assert state["ready"].tolist() == [1.0, 1.0, 0.0, 1.0]
    assert info["tracking_fresh"].tolist() == [False, True, False, True]
    assert metrics["prep_samples"].tolist() == [0.0, 3.0, 0.0, 1.0]
    secs = metrics["prep_s"]
    assert secs[0] == 0 and secs[2] == 0 and secs[1] >= 0 and secs[3] >= 0
    assert states["y"]["w"][1].tolist() == [0.0, 0.0]  # the input is not modified
