"""A tiny reproduction end to end: files land where promised, and resume skips finished runs."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from fedforge.reproduce import (
    REPRODUCTIONS,
    Comparison,
    Condition,
    Reproduction,
    get_reproduction,
    reproduce,
)
from fedforge.reproduce.grid import grid_plan, run_grid
from fedforge.reproduce.report import paper_scale, write_report

ROOT = Path(__file__).resolve().parents[2]


def tiny_spec() -> Reproduction:
    return Reproduction(
        name="tiny",
        claim="A larger local learning rate helps on Synthetic(1, 1) (test only).",
        config="examples/quickstart.toml",
        conditions=(Condition("fast", "fedavg", ("algorithm.local_lr=0.05",), label="lr 0.05"),
                    Condition("slow", "fedavg", ("algorithm.local_lr=0.001",), label="lr 0.001")),
        seeds=(0, 1),
        target=0.2,
        overrides=("rounds=2", "eval.every=1", "checkpoint.every=1",
                   "server.clients_per_round=4"),
        comparisons=(Comparison("fast", "slow", "final_acc", ">"),
                     Comparison("fast", "slow", "rounds", "<")),
        diagnostics=("train_loss",),
        paper={"fast": "1.0"},
        paper_commands=("fedforge compare examples/quickstart.toml -a fedavg",),
        paper_compute="seconds",
        stages=(("slow",),),
        sensitivity=(0.1, 0.3),
    )


def test_plan_runs_the_core_conditions_for_every_seed_first(tmp_path):
    plan = [(c.name, cfg.seed) for c, cfg, _ in grid_plan(tiny_spec(), ROOT, tmp_path)]
    assert plan == [("slow", 0), ("slow", 1), ("fast", 0), ("fast", 1)]


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setitem(REPRODUCTIONS, "tiny", tiny_spec)
    return tiny_spec()


def test_tiny_reproduction_end_to_end(tiny, tmp_path):
    runs, data, docs = tmp_path / "runs", tmp_path / "data", tmp_path / "docs"
    page = reproduce("tiny", root=ROOT, runs=runs, data=data, out=docs, progress=False)
    for cond in ("fast", "slow"):
        for seed in (0, 1):
            assert (runs / "tiny" / cond / f"seed{seed}" / "metrics.jsonl").is_file()
            assert (data / "tiny" / cond / f"seed{seed}.jsonl").is_file()
    assert page == docs / "reproductions" / "tiny.md"
    assert (docs / "img" / "tiny_accuracy.png").is_file()
    assert (docs / "img" / "tiny_diagnostics.png").is_file()
    text = page.read_text()
    assert "lr 0.05" in text and "incomplete" not in text
    assert "(paired by seed)" in text and "**Verdict.**" in text
    assert "Sensitivity to the target" in text and "target 0.3" in text

    # a second call runs nothing: every run is finished
    stamp = {p: p.stat().st_mtime_ns for p in runs.rglob("metrics.jsonl")}
    counts = run_grid(tiny, root=ROOT, runs=runs, data=data, progress=False)
    assert counts == {"skipped": 4, "ran": 0, "diverged": 0, "total": 4}
    assert stamp == {p: p.stat().st_mtime_ns for p in runs.rglob("metrics.jsonl")}

    # a fresh machine (no run folders) trusts the committed metrics and reruns only what is
    # missing from them
    shutil.rmtree(runs)
    (data / "tiny" / "fast" / "seed1.jsonl").unlink()
    counts = run_grid(tiny, root=ROOT, runs=runs, data=data, progress=False)
    assert counts == {"skipped": 3, "ran": 1, "diverged": 0, "total": 4}
    assert [p.parent.name for p in runs.rglob("metrics.jsonl")] == ["seed1"]

    # the report needs only the copied metrics; a missing run is reported as such
    (data / "tiny" / "fast" / "seed1.jsonl").unlink()
    page = write_report(tiny, data, tmp_path / "docs2")
    assert "incomplete: 3 of 4 runs" in page.read_text()


def test_paper_scale_prints_commands_and_compute(tiny):
    text = paper_scale(tiny)
    assert "fedforge compare examples/quickstart.toml -a fedavg" in text
    assert "compute: seconds" in text


def test_fadamgc_spec_is_registered_and_valid():
    from fedforge.reproduce import get_reproduction

    spec = get_reproduction("fadamgc")
    assert len(spec.conditions) == 11 and spec.seeds == (0, 1, 2)
    plan = grid_plan(spec, ROOT, Path("runs"))
    assert len(plan) == 33
    order = [c.name for c, _, _ in plan]
    assert order[:9] == ["fadamgc", "localadam", "fa_nt"] * 3  # the core, every seed first
    assert order[9:13] == ["scaffold_m", "fedavg_m", "fedams", "fedadam"]
    cfgs = {c.name: cfg for c, cfg, _ in plan if cfg.seed == 0}
    assert cfgs["fadamgc_st0"].algorithm.tracking_fraction == 0.0
    assert cfgs["fadamgc_fullgrad"].algorithm.tracking_init == "full_gradient"
    assert cfgs["fedadam"].algorithm.server_lr == 1e-3
    assert cfgs["fadamgc"].client.local_steps == 60 and cfgs["fadamgc"].rounds >= 150


def test_unknown_spec_is_an_error():
    from fedforge.reproduce import get_reproduction

    with pytest.raises(KeyError, match="unknown reproduction"):
        get_reproduction("nope")


def test_a_claim_on_final_accuracy_alone_has_no_target_columns():
    from dataclasses import replace

    from fedforge.reproduce.report import condition_table

    spec = tiny_spec()
    timed = condition_table(replace(spec, target=None), {}).splitlines()[0]
    assert "rounds to" in timed  # a rounds comparison: the target is only not set yet
    final = replace(spec, target=None, comparisons=tuple(
        replace(c, metric="final_acc") for c in spec.comparisons))
    header = condition_table(final, {}).splitlines()[0]
    assert "rounds to" not in header and "sim. s to" not in header
    assert "final acc." in header


def test_a_diverged_run_is_an_outcome_the_grid_records_and_skips(tmp_path, monkeypatch):
    """A seed stopped by NaN does not stop the grid; the report marks it; reruns skip it."""
    from dataclasses import replace

    import fedforge.reproduce.grid as grid
    from fedforge.robust.divergence import log_event

    real = grid.run_experiment

    def run(cfg, out, **kw):  # the "boom" condition diverges in round 2, after one record
        if cfg.algorithm.hparams.get("local_lr") != 0.5:
            return real(cfg, out, **kw)
        out.mkdir(parents=True)
        (out / "metrics.jsonl").write_text(json.dumps(
            {"round": 1, "train_loss": 2.0, "test_accuracy": 0.125, "sim_time_s": 1.0}) + "\n")
        log_event(out, {"round": 2, "policy": "stop", "faults": [[0, "loss=nan"]]})
        raise FloatingPointError("round 2: diverged")

    monkeypatch.setattr(grid, "run_experiment", run)
    spec = replace(tiny_spec(), name="boom", seeds=(0,), stages=(), conditions=(
        Condition("boom", "fedavg", ("algorithm.local_lr=0.5",), label="lr 0.5"),
        Condition("fast", "fedavg", ("algorithm.local_lr=0.05",), label="lr 0.05")),
        comparisons=(Comparison("fast", "boom", "final_acc", ">"),))
    runs, data = tmp_path / "runs", tmp_path / "data"
    counts = run_grid(spec, root=ROOT, runs=runs, data=data, progress=False, log=lambda m: None)
    assert counts == {"skipped": 0, "ran": 2, "diverged": 1, "total": 2}
    marker = json.loads((data / "boom" / "boom" / "seed0.diverged.json").read_text())
    assert marker == {"round": 2, "budget": 2}
    assert (data / "boom" / "fast" / "seed0.jsonl").is_file()
    again = run_grid(spec, root=ROOT, runs=runs, data=data, progress=False, log=lambda m: None)
    assert again == {"skipped": 2, "ran": 0, "diverged": 1, "total": 2}
    text = write_report(spec, data, tmp_path / "docs").read_text()
    assert "| lr 0.5 | – | ≥ 2.0 (0/1 reached)" in text  # a missed target: the full budget
    assert "0.1250 | " in text and "0†2" in text and "non-finite values" in text


def test_prepare_runs_once_before_the_first_run(tmp_path, monkeypatch):
    """A spec's ``prepare`` (e.g. pre-training) sees the root and runs before any condition."""
    import dataclasses

    calls = []
    spec = dataclasses.replace(tiny_spec(), prepare=lambda root: calls.append(root))
    import fedforge.reproduce.grid as grid

    class FirstRun(Exception):
        pass

    def first_run(*_a, **_k):
        calls.append("run")
        raise FirstRun

    monkeypatch.setattr(grid, "run_experiment", first_run)
    with pytest.raises(FirstRun):
        run_grid(spec, root=ROOT, runs=tmp_path / "runs", data=tmp_path / "data",
                 progress=False, log=lambda _: None)
    assert calls == [ROOT, "run"]


def test_prepare_is_skipped_when_every_run_is_committed(tmp_path):
    """A fresh clone with the committed metrics runs nothing, so it prepares nothing."""
    import dataclasses

    calls = []
    spec = dataclasses.replace(tiny_spec(), prepare=lambda root: calls.append(root))
    data = tmp_path / "data"
    for cond in ("fast", "slow"):
        for seed in (0, 1):
            path = data / "tiny" / cond / f"seed{seed}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text('{"round": 1}\n{"round": 2, "test_accuracy": 0.5}\n')
    counts = run_grid(spec, root=ROOT, runs=tmp_path / "runs", data=data, progress=False,
                      log=lambda _: None)
    assert counts["skipped"] == 4 and counts["ran"] == 0
    assert calls == []


def test_safl_pretraining_is_skipped_when_its_checkpoint_exists(tmp_path, monkeypatch):
    from fedforge.reproduce.papers import safl

    (tmp_path / safl.CHECKPOINT).parent.mkdir(parents=True)
    (tmp_path / safl.CHECKPOINT).write_bytes(b"")
    monkeypatch.setattr("fedforge.pretrain.pretrain", lambda *a, **k: pytest.fail("pretrained"))
    safl.pretrain_checkpoint(tmp_path)


def test_figures_pair_the_two_sides_of_a_one_to_one_comparison():
    """NAR and vanilla of one backbone share a colour (NAR solid, vanilla dashed); a
    condition compared with several others keeps a colour of its own."""
    from fedforge.reproduce.report import line_styles

    nar = line_styles(get_reproduction("fednar"), ["fedavg_nar", "fedavg_vanilla",
                                                   "fedprox_nar", "fedprox_vanilla"])
    assert nar["fedavg_nar"] == {**nar["fedavg_vanilla"], "ls": "-"}
    assert nar["fedavg_vanilla"]["ls"] == "--"
    assert nar["fedprox_nar"]["color"] != nar["fedavg_nar"]["color"]
    fedptr = get_reproduction("fedptr")
    assert {"c10_fedptr", "c10_fedavg"} <= {c.name for c in fedptr.conditions}
    ptr = line_styles(fedptr, ["c10_fedptr", "c10_fedavg"])
    assert {s["ls"] for s in ptr.values()} == {"-"}
    assert len({(s["color"], s["marker"]) for s in ptr.values()}) == 2


def test_reproduction_figures_colour_a_method_as_every_other_figure_does():
    """A condition that runs an algorithm unchanged takes that algorithm's fedforge look."""
    from fedforge.reproduce.report import method_looks
    from fedforge.study.styles import styles_for

    spec = get_reproduction("fadamgc")
    plain = [c for c in spec.conditions if not c.overrides]
    looks = method_looks(spec, [c.name for c in plain])
    styles = styles_for(c.algorithm for c in plain)
    assert plain and all(looks[c.name]["color"] == styles[c.algorithm].color for c in plain)
    assert len({(v["color"], v["marker"]) for v in looks.values()}) == len(plain)


def test_a_paired_sweep_tables_and_plots_the_difference_per_value(tmp_path):
    from fedforge.reproduce import Sweep
    from fedforge.reproduce.report import RunSummary, plot_sweep, sweep_table

    def run(seed, acc):
        return RunSummary(seed, 1.0, 1.0, acc, True, 1.0, [])

    runs = {"a1": {0: run(0, 0.50), 1: run(1, 0.60)}, "b1": {0: run(0, 0.40), 1: run(1, 0.45)},
            "a2": {0: run(0, 0.30)}, "b2": {}}
    sweep = Sweep("lr sweep", "lr", ((0.1, "a1", "b1"), (1.0, "a2", "b2")), "A", "B")
    table = sweep_table(runs, sweep).splitlines()
    assert table[2].startswith("| 0.1 | 0.5500 ± ") and "| 0.1250 ± " in table[2]
    assert table[3] == "| 1 | 0.3000 | – | – | 0 |"
    assert plot_sweep(runs, sweep, tmp_path / "s.png").stat().st_size > 0
    with pytest.raises(ValueError, match="sweep 'lr sweep' names unknown condition 'nope'"):
        replace(tiny_spec(), sweeps=(Sweep("lr sweep", "lr", ((1.0, "fast", "nope"),)),))
