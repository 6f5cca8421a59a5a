"""LocalAdam's default local learning rate is pinned to its source (FAdamGC, App. H Table 4:
η_l = 1e-3), in the factory, in the defaults table and in the step a default build takes."""

import torch

from fedforge.algorithms import algorithm_hparams, build_algorithm
from fedforge.algorithms.defaults import ALGORITHM_DEFAULTS
from tests.quadratic import run_rounds


def test_localadam_default_local_lr_is_the_papers():
    assert algorithm_hparams("localadam")["local_lr"] == 1e-3
    entry = ALGORITHM_DEFAULTS["localadam"]["local_lr"]
    assert entry.value == 1e-3 and entry.source == "paper" and "Table 4" in entry.ref


def test_localadam_first_step_uses_the_default_lr():
    """One AMSGrad step without bias correction from m = v = 0:
    lr (1 - β1) g / (sqrt((1 - β2) g²) + ε), with lr = 1e-3, β1 = 0.9, β2 = 0.99, ε = 1e-8."""
    w0 = torch.tensor([0.3, -0.2], dtype=torch.float64)
    params, *_ = run_rounds(build_algorithm("localadam"), [[1.0, 0.0, 0.0]], w0.tolist())
    g = w0  # a (w - b) with a = 1, b = 0
    step = 1e-3 * 0.1 * g / ((0.01 * g**2).sqrt() + 1e-8)
    torch.testing.assert_close(params["w"], w0 - step, rtol=0, atol=1e-15)
