"""benchmarks/step_cost.py: every row trains (a one-thread table of one client's update)."""

import importlib.util
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "step_cost.py"


def _module():
    spec = importlib.util.spec_from_file_location("step_cost", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_conv_net_gets_both_layouts_and_a_dense_model_one(monkeypatch, capsys):
    step_cost = _module()
    monkeypatch.setattr(step_cost, "TARGET_S", 0.0)  # the fewest clients (3)
    monkeypatch.setattr(step_cost, "PASSES", 1)
    n, rows = step_cost.rows_for("lenet5")
    assert n == 3 and list(rows) == ["plain", "loop", "loop channels-last"]
    assert list(step_cost.rows_for("logreg")[1]) == ["plain", "loop"]
    threads = torch.get_num_threads()
    try:
        step_cost.main(["logreg"])
    finally:
        torch.set_num_threads(threads)  # main() trains on one thread, as a worker does
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith("| logreg | 3 | ") and line.count("|") == 7 and "| - |" in line
