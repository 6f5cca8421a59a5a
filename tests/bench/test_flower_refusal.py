"""``fedforge bench --engines ...,flower`` without Flower's simulation engine refuses at once:
one error line naming ``pip install "fedforge[bench]"``, exit code 2, and no row timed."""

import pytest
from typer.testing import CliRunner

from fedforge.bench import flower_w1, throughput
from fedforge.cli import app


@pytest.fixture
def no_timing(monkeypatch):
    """Fail the test if anything is measured: the GEMM peak, FLOP count or a timed row."""
    calls: list[str] = []

    def record(name):
        def fake(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"{name} ran before the Flower check")
        return fake

    for name in ("timed", "peak_gflops", "flops_per_update", "make_data"):
        monkeypatch.setattr(throughput, name, record(name))
    return calls


@pytest.mark.parametrize("missing", ["flwr", "ray"])
def test_missing_flower_refuses_in_one_line_before_timing(monkeypatch, no_timing, tmp_path,
                                                           missing):
    monkeypatch.setattr(flower_w1, "flower_missing", lambda: missing)
    results = tmp_path / "results"
    res = CliRunner().invoke(app, ["bench", "w1", "--cohorts", "2", "--engines",
                                   "plain,flower", "--results", str(results)])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1, res.output
    assert 'pip install "fedforge[bench]"' in lines[0] and repr(missing) in lines[0]
    assert isinstance(res.exception, SystemExit) and "Traceback" not in res.output
    assert no_timing == [] and not results.exists()


def test_flower_missing_names_the_first_absent_module(monkeypatch):
    import importlib

    def fake(name, *args):
        if name == "ray":
            raise ModuleNotFoundError("No module named 'ray'")
        return object()

    monkeypatch.setattr(importlib, "import_module", fake)
    assert flower_w1.flower_missing() == "ray"
    with pytest.raises(ValueError, match=r"fedforge\[bench\]"):
        flower_w1.check_flower()


def test_flower_takes_no_suffix():
    with pytest.raises(ValueError, match="no suffix"):
        throughput.run_w1([1], ["plain", "flower:bf16"], throughput.torch.device("cpu"))
