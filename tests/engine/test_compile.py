"""``VmapEngine(compile=True)`` (``engine.compile``) gives the eager engine's results.

Tiny MLP, two rounds, four clients in one chunk (client 1's last step is padding, so the
masked path is compiled); parameters, server state and the client store must agree.
Compiling takes tens of seconds on a small CPU, hence ``slow``.
"""

import pytest
import torch

from fedforge.algorithms import build_algorithm
from fedforge.engine import VmapEngine, build_engine
from fedforge.experiment.config import EngineConfig
from fedforge.models import build_model
from tests.engine.test_parity import MODELS, NUM_CLASSES, _data, _hparams, _run, assert_same_run


@pytest.mark.slow
@pytest.mark.parametrize("algo_name,mode", [
    ("fedavg", True), ("scaffold", True),
    ("fedavg", "reduce-overhead"),  # CUDA graphs on a GPU; on a CPU the same inductor graph
])
def test_compiled_vmap_matches_eager(algo_name, mode):
    shape, kwargs, kind = MODELS["mlp"]
    torch.manual_seed(0)
    model = build_model("mlp", shape, NUM_CLASSES, **kwargs)
    x, y, sample_idx, weights = _data(kind, shape)
    algorithm = build_algorithm(algo_name, **_hparams(algo_name))
    ref = _run(algorithm, VmapEngine(chunk_size=4), model, x, y, sample_idx, weights)
    fast = _run(algorithm, VmapEngine(chunk_size=4, compile=mode), model, x, y, sample_idx,
                weights)
    assert_same_run(ref, fast, rtol=1e-5)


def test_compile_option_is_off_by_default_and_passed_through():
    assert EngineConfig().compile is False
    assert VmapEngine().compile is False
    for name in ("vmap", "distributed", "auto"):
        section = EngineConfig(name=name, compile=True)
        assert build_engine(section, allow_processes=False).compile is True
    assert EngineConfig(compile="reduce-overhead").compile == "reduce-overhead"
    with pytest.raises(ValueError, match="compile"):
        EngineConfig(compile="fastest")


def test_compile_balances_auto_chunks():
    from fedforge.engine.base import CohortInputs

    x_all = torch.zeros(1, 4)
    params = {"w": torch.zeros(4)}
    inputs = CohortInputs(params, {}, {}, {}, torch.zeros(10, 2, 3, dtype=torch.long),
                          torch.ones(10, 2, 3), torch.full((10,), 0.1))
    assert VmapEngine(cpu_max_chunk=8).chunk_size(inputs, x_all) == 8  # eager: 8 + 2
    assert VmapEngine(cpu_max_chunk=8, compile=True).chunk_size(inputs, x_all) == 5  # 5 + 5
