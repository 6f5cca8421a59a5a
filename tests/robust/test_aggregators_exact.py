"""The robust aggregators' edges, by hand: the names runs and logs go by, the plain weighted
mean over leaves of two dtypes, trimming and clipping at their boundaries, Krum with one or
two clients, and the option checks.

The hand-number tests beside this file check each rule on a typical cohort; these check
where a wrong variant of the same rule would still pass them.
"""

import pytest
import torch

from fedforge.robust.aggregators import (
    AGGREGATORS,
    build_aggregator,
    krum,
    meamed,
    mean_around,
    multi_krum,
    norm_clip,
    trimmed_mean,
    weighted_mean,
)

F64 = torch.float64


@pytest.mark.parametrize("name", sorted(AGGREGATORS))
def test_each_aggregator_goes_by_its_config_name(name):
    """The name is what a run logs and a resume checks against ``server.aggregator``."""
    assert build_aggregator(name).name == name


def _two_leaves() -> dict:
    return {"a": torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 8.0]], dtype=F64),
            "b": torch.tensor([2.0, -4.0, 6.0])}  # a float32 leaf beside a float64 one


def test_the_weighted_mean_weighs_each_leaf_in_its_own_dtype():
    out, info = weighted_mean().aggregate(_two_leaves(), torch.tensor([0.5, 0.25, 0.25]))
    assert info == {}
    assert torch.equal(out["a"], torch.tensor([2.5, 4.0], dtype=F64))
    assert out["b"].dtype == torch.float32 and out["b"].item() == 1.5


def test_the_trimmed_mean_cuts_floor_beta_n_on_each_side():
    """beta = 0.34 of 3 clients cuts one value each side: the median is left."""
    deltas = {"w": torch.tensor([[0.0], [1.0], [9.0]])}
    out, info = trimmed_mean(0.34).aggregate(deltas, torch.full((3,), 1 / 3))
    assert out["w"].item() == 1.0 and info["trimmed"].item() == 1.0
    out, info = trimmed_mean(0.33).aggregate(deltas, torch.full((3,), 1 / 3))
    assert out["w"].item() == pytest.approx(10 / 3) and info["trimmed"].item() == 0.0


def test_norm_clip_scales_only_updates_above_the_bound_over_every_leaf():
    """Norms 0.5 (below 1: kept as it is) and 2 (scaled by 1/2), over a float64 and a
    float32 leaf together."""
    deltas = {"a": torch.tensor([[0.3], [1.2]], dtype=F64), "b": torch.tensor([[0.4], [1.6]])}
    out, info = norm_clip(1.0).aggregate(deltas, torch.tensor([0.5, 0.5]))
    assert out["a"].item() == pytest.approx(0.5 * 0.3 + 0.5 * 0.6)
    assert out["b"].dtype == torch.float32 and out["b"].item() == pytest.approx(0.2 + 0.4)
    assert info["clipped"].item() == 0.5


def test_norm_clip_below_one_divides_by_the_norm_itself():
    """Norm 0.5 with bound 0.25: scale 1/2, whatever the guard against a zero norm."""
    out, _ = norm_clip(0.25).aggregate({"w": torch.tensor([[0.3, 0.4]])}, torch.ones(1))
    assert torch.allclose(out["w"], torch.tensor([0.15, 0.2]))


def test_krum_with_one_client_returns_it():
    out, info = krum().aggregate({"w": torch.tensor([[4.0, -1.0]])}, torch.ones(1))
    assert torch.equal(out["w"], torch.tensor([4.0, -1.0]))
    assert list(info) == ["selected"] and torch.equal(info["selected"], torch.zeros(1))


def test_krum_of_two_clients_averages_as_many_as_asked():
    deltas = {"w": torch.tensor([[0.0], [2.0]])}
    out, info = krum(f=0, m=2).aggregate(deltas, torch.full((2,), 0.5))
    assert out["w"].item() == 1.0 and torch.equal(info["selected"], torch.tensor([0.0, 1.0]))
    out, info = multi_krum(f=1).aggregate(deltas, torch.full((2,), 0.5))  # C - f = 1 picked
    assert info["selected"].numel() == 1


def test_multi_krum_keeps_the_m_it_is_given():
    deltas = {"w": torch.tensor([[0.0], [1.0], [2.0], [3.0], [40.0]])}
    _, info = multi_krum(f=1, m=2).aggregate(deltas, torch.full((5,), 0.2))
    assert info["selected"].numel() == 2


def test_krum_accepts_no_byzantine_clients_and_refuses_a_negative_f_in_one_line():
    krum(f=0)
    with pytest.raises(ValueError, match=r"^server.aggregator_options: expected f >= 0 and "
                       r"m >= 1, got f=-1, m=1$"):
        krum(f=-1, m=1)


@pytest.mark.parametrize("f", [True, 1.5, -1])
def test_f_must_be_a_non_negative_integer(f):
    with pytest.raises(ValueError, match=r"^server.aggregator_options.f: expected an integer"):
        meamed(f)


def test_mean_around_breaks_ties_towards_the_earlier_row():
    """Rows 1 and 5 are both 2 from the reference 3: the earlier one (1) is kept."""
    values = torch.tensor([[1.0], [3.0], [5.0]])
    assert mean_around(torch.tensor([3.0]), values, 2).item() == 2.0
