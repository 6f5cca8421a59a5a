"""Exact checks of FedAST's allocation rules (src/fedforge/schedulers/allocation.py): the variance
estimate over several tensors, the largest-remainder split and its reserve, the Realloc
square root and the buffer rule at their edges (docs/testing.md).
"""

import pytest
import torch

from fedforge.schedulers.allocation import (
    buffer_size,
    estimate_variance,
    normalized_variance,
    proportional_split,
    realloc,
)


def test_normalized_variance_over_every_tensor():
    """Two deltas over two tensors: (1, 0 | 2) and (3, 0 | 0) -> mean (2, 0 | 1), spread
    mean(1 + 1, 1 + 1) = 2, ||mean||² = 5."""
    w = [{"a": torch.tensor([1.0, 0.0]), "b": torch.tensor([[2.0]])},
         {"a": torch.tensor([3.0, 0.0]), "b": torch.tensor([[0.0]])}]
    assert normalized_variance(w) == pytest.approx(2 / 5, rel=1e-12)
    three = [{"w": torch.tensor([x])} for x in (1.0, 2.0, 6.0)]  # mean 3: (4 + 1 + 9)/3 / 9
    assert normalized_variance(three) == pytest.approx(14 / 27, rel=1e-12)
    zero_mean = [{"w": torch.tensor([1.0])}, {"w": torch.tensor([-1.0])}]
    assert normalized_variance(zero_mean) == pytest.approx(1e30, rel=1e-9)
    with pytest.raises(ValueError, match=r"^normalized_variance: need at least 2 updates in "
                                         r"the window$"):
        normalized_variance(w[:1])
    assert estimate_variance(three, 0.1, 2.0, 5) == pytest.approx(14 / 27, rel=1e-12)


def test_proportional_split_by_hand():
    assert proportional_split(10, []) == []
    assert proportional_split(7, [1, 2, 4]) == [1, 2, 4]
    assert proportional_split(10, [0.12, 0.27, 0.61]) == [1, 3, 6]  # largest remainder
    assert proportional_split(10, [0.15, 0.25, 0.6]) == [2, 2, 6]  # tie -> lower index
    assert proportional_split(10, [0, 1]) == [1, 9]  # the reserve of 1 only when needed
    assert proportional_split(10, [1, 4], minimum=2) == [2, 8]  # 2 and 8 need no reserve
    # 1 < 2: reserve 2 each, split the spare 6 as 0.6 : 5.4 -> 0 + 1 : 5
    assert proportional_split(10, [1, 9], minimum=2) == [3, 7]
    assert proportional_split(4, [float("nan"), 1.0]) == [2, 2]  # bad weights: equal
    assert proportional_split(4, [0.0, 0.0]) == [2, 2]
    assert proportional_split(4, [-1.0, 0.5]) == [2, 2]  # a non-positive sum: equal
    assert proportional_split(3, [1.0, 1.0], minimum=0) == [2, 1]
    assert proportional_split(2, [1.0, 1.0]) == [1, 1]  # exactly the minimum
    with pytest.raises(ValueError, match=r"^cannot give 2 tasks >= 3 of 5 requests$"):
        proportional_split(5, [1, 1], minimum=3)


def test_realloc_square_root_and_minimum():
    assert realloc([3, 5], [1.0, 9.0]) == [2, 6]
    assert realloc([5, 5], [-1.0, 4.0]) == [1, 9]  # a negative estimate counts as 0
    assert realloc([4, 4], [0.0, 1.0], minimum=2) == [2, 6]
    assert realloc([2.0, 2.0], [1.0, 1.0]) == [2, 2]


def test_buffer_size_edges():
    assert [buffer_size(r) for r in (0, 1, 32, 33, 64, 65)] == [1, 1, 1, 2, 2, 3]
    assert buffer_size(10, 4.0) == 3 and buffer_size(8, 4.0) == 2
