"""FedAST's split (``dirichlet_fixed_size``): a Dir(alpha) label mix and a fixed size each."""

import numpy as np

from fedforge.data.partition import dirichlet_fixed_size


def test_dirichlet_fixed_size():
    labels = np.repeat(np.arange(10), 50)  # 500 samples; 40 clients x 30 needs refills
    parts = dirichlet_fixed_size(labels, 40, 0.1, 30, np.random.default_rng(0))
    sizes = [len(p) for p in parts]
    assert all(abs(s - 30) <= 5 for s in sizes)
    few = np.mean([len(np.unique(labels[p])) for p in parts])
    assert few < 4  # alpha 0.1: few classes per client
