"""Benchmark plumbing (not speed): workloads build, engines agree, results are recorded."""

import pytest
import torch
from typer.testing import CliRunner

from fedforge.bench import record_results, run_info
from fedforge.bench.throughput import (
    W1_HEADER,
    check_engine_name,
    flops_per_update,
    peak_gflops,
    plain_warmup,
    run_w1,
)
from fedforge.bench.time_to_accuracy import first_reaching
from fedforge.bench.workload import W1, Workload, for_model, make_data
from fedforge.models import build_model

TINY = Workload("T", "logreg", (1, 28, 28), steps=2, batch=4)


def test_make_data_gives_each_client_its_own_epoch():
    x, y, idx = make_data(3, torch.device("cpu"), TINY)
    assert x.shape == (3 * 8, 1, 28, 28) and idx.shape == (3, 2, 4)
    for c in range(3):  # a permutation of the client's own 8 samples
        assert sorted(idx[c].flatten().tolist()) == list(range(8 * c, 8 * c + 8))


def test_flops_per_update_counts_forward_and_backward():
    model = build_model("logreg", (1, 28, 28), 10)
    # forward 2*B*784*10; backward: weight grad 2*B*784*10 (the input needs no grad)
    assert flops_per_update(model, TINY) == 2 * (2 * 4 * 784 * 10) * TINY.steps


def test_peak_gflops_is_a_rate():
    assert peak_gflops(torch.device("cpu"), n=64, repeats=1) > 0


def test_run_w1_rows_and_results_file(tmp_path):
    engines = ["plain", "loop", "vmap", "auto", "vmap:bf16"]
    rows = run_w1([2], engines, torch.device("cpu"), work=TINY, profile_dir=tmp_path / "prof")
    assert [r[0] for r in rows] == engines and all(len(r) == len(W1_HEADER) for r in rows)
    assert all(r[1] == 2 and r[2] > 0 for r in rows) and rows[0][6] == "1.00x"
    gflop = flops_per_update(build_model("logreg", (1, 28, 28), 10), TINY) / 1e9
    assert rows[1][3] == pytest.approx(rows[1][2] * gflop)  # GFLOP/s = updates/s x GFLOP
    assert (tmp_path / "prof" / "T_vmap-bf16_2.trace.json").is_file()
    assert "aten::" in (tmp_path / "prof" / "T_auto_2.top.txt").read_text()
    record_results(tmp_path / "results", "w1", "logreg", "T", W1_HEADER, rows, run_info())
    text = (tmp_path / "results" / "RESULTS.md").read_text()
    assert "| vmap:bf16 | 2 |" in text and "torch " + torch.__version__ in text
    assert (tmp_path / "results" / "w1-logreg.json").is_file()


def test_only_the_one_process_plain_row_warms_up_on_a_prefix(monkeypatch):
    monkeypatch.setattr("fedforge.bench.throughput.PLAIN_WARMUP_CLIENTS", 2)
    model = build_model("logreg", (1, 28, 28), 10)
    data = (model, *make_data(5, torch.device("cpu"), TINY))
    seen = []
    monkeypatch.setattr("fedforge.bench.throughput.plain_loop",
                        lambda m, x, y, idx, precision: seen.append(idx.shape[0]))
    cpu = torch.device("cpu")
    plain_warmup(check_engine_name("plain", cpu), "auto", data, TINY)()
    assert seen == [2]
    for name in ("plain:procs2", "loop", "auto"):
        assert plain_warmup(check_engine_name(name, cpu), "auto", data, TINY) is None


def test_two_processes_row():
    rows = run_w1([2], ["plain:procs2"], torch.device("cpu"), work=TINY)
    assert rows[0][0] == "plain:procs2" and rows[0][2] > 0


def test_sequence_models_get_token_inputs_on_the_same_schedule():
    """A model that embeds tokens runs on random sequences (no padding token drawn); an
    image model keeps the workload's images."""
    assert for_model(W1, "convnet") == Workload("W1", "convnet", (1, 28, 28), 10, 32)
    text = for_model(TINY, "char_lstm")
    assert (text.vocab, text.input_shape, text.steps, text.batch) == (80, (80,), 2, 4)
    x, y, idx = make_data(2, torch.device("cpu"), text)
    assert x.dtype == torch.int64 and x.shape == (16, 80) and 1 <= x.min() and x.max() < 80
    rows = run_w1([2], ["plain", "loop"], torch.device("cpu"),
                  work=for_model(TINY, "text_classifier"))
    assert [r[0] for r in rows] == ["plain", "loop"] and all(r[2] > 0 for r in rows)


@pytest.mark.parametrize(("engines", "match"), [
    (["jax"], "unknown engine"), (["vmap:fp8"], "unknown suffix"),
    (["plain:compile"], "vmap options"), (["flower:procs2"], "procs2"),
    (["vmap:nhwc"], "loop/procs option")])
def test_bad_engine_names_are_clear_errors(engines, match):
    with pytest.raises(ValueError, match=match):
        run_w1([1], engines, torch.device("cpu"), work=TINY)


def test_run_profile_writes_a_trace_in_the_run_folder(tmp_path):
    from fedforge.cli import app

    cfg = "examples/quickstart.toml"
    res = CliRunner().invoke(app, ["run", cfg, "rounds=1", "eval.every=1", "--out",
                                   str(tmp_path / "run"), "--quiet", "--profile"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "run" / "profile" / "run.trace.json").stat().st_size > 0
    assert "Self CPU" in (tmp_path / "run" / "profile" / "run.top.txt").read_text()


def test_first_reaching():
    hist = [{"round": 5, "test_accuracy": 0.5}, {"round": 10, "test_accuracy": 0.81},
            {"round": 15, "test_accuracy": 0.9}]
    assert first_reaching(hist, 0.8)["round"] == 10
    assert first_reaching(hist, 0.95) is None
