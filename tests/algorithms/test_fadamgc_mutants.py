"""FAdamGC's tracking part (src/fedforge/algorithms/fadamgc.py): argument errors and the
tracking subset drawn from the round's generator only. Written to kill the mutants the
mutation run left (docs/testing.md)."""

import pytest
import torch

from fedforge.algorithms.fadamgc import GradientTracking, num_tracking, sample_tracking


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
