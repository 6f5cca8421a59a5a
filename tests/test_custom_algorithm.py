"""The documented way to add an algorithm from existing parts works as written."""

import inspect
import runpy
from pathlib import Path

from fedforge.algorithms import ALGORITHMS, build_algorithm

EXAMPLE = Path(__file__).resolve().parents[1] / "examples/custom_algorithm.py"


def test_example_factory_is_short_and_registers(monkeypatch):
    monkeypatch.setattr("fedforge.algorithms.ALGORITHMS", dict(ALGORITHMS))
    namespace = runpy.run_path(str(EXAMPLE), run_name="example")
    factory = namespace["fedprox_yogi"]
    lines = [ln for ln in inspect.getsource(factory).splitlines() if ln.strip()]
    assert len(lines) <= 25
    algo = build_algorithm("fedprox_yogi", mu=0.1)
    assert [s.name for s in algo.server.stages] == ["opt", "parts"]
