import numpy as np
import pytest

from fedforge.sim.population import Population, class_sizes, speed_factors


def test_fedast_proportions_exact():
    s = speed_factors(1000, seed=64)
    assert [(s == f).sum() for f in (1.3, 1.0, 0.7)] == [250, 500, 250]


def test_class_sizes_largest_remainder():
    # 10 clients: raw 2.5 / 5 / 2.5 -> floors 2 / 5 / 2, the one spare goes to the first tie
    assert class_sizes(10, [0.25, 0.5, 0.25]).tolist() == [3, 5, 2]
    assert class_sizes(7, [0.25, 0.5, 0.25]).sum() == 7


def test_speeds_fixed_by_seed_and_shuffled():
    a, b = speed_factors(100, seed=1), speed_factors(100, seed=1)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, speed_factors(100, seed=2))
    assert not np.array_equal(a, np.sort(a)[::-1])  # not class-sorted


def test_bad_classes_and_availability():
    with pytest.raises(ValueError, match="system.speed_classes"):
        speed_factors(10, [(0.5, 1.0), (0.4, 2.0)])
    with pytest.raises(ValueError, match="system.available_fraction"):
        Population(np.ones(3), available_fraction=0.0)
    pop = Population.build(1000, available_fraction=0.3)
    assert pop.max_busy == 300
    got = pop.sample_available(np.random.default_rng(0))
    assert len(set(got.tolist())) == 300
