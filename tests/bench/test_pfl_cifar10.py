"""fedforge bench pfl-cifar10: pfl-research's CIFAR-10 workload, exactly, and a --quick run of
every row end to end (a peer that is not installed gets a row saying so)."""

import subprocess
import sys

import pytest

from fedforge.bench import pfl_cifar10
from fedforge.bench.pfl_cifar10 import (
    HEADER,
    PFL_CIFAR10,
    QUICK,
    cohort_ids,
    parse_frameworks,
    run_pfl_cifar10,
)
from fedforge.bench.pfl_cifar10_run import RUN_ITERATIONS, batches
from fedforge.bench.results import record_results, run_info
from fedforge.models import build_model, num_parameters


def test_the_workload_is_pfl_researchs_cifar10_baseline():
    w = PFL_CIFAR10
    assert (w.users, w.per_user, w.cohort) == (1000, 50, 50)
    assert (w.epochs, w.batch, w.steps, w.local_lr, w.central_lr) == (1, 10, 5, 0.1, 1.0)
    assert RUN_ITERATIONS == 1500 and w.eval_batch == 10000 and w.test_size == 10000
    assert num_parameters(build_model(w.model, (3, 32, 32), 10)) == 1_626_442
    # user 7's local epoch: its own 50 rows, in order, in 5 batches of 10
    got = batches(w, 7)
    assert [b.tolist() for b in got] == [list(range(350 + 10 * k, 360 + 10 * k))
                                         for k in range(5)]


def test_cohorts_are_the_same_draw_in_every_process_and_differ_by_iteration():
    first = cohort_ids(PFL_CIFAR10, 1)
    assert len(set(first)) == 50 and all(0 <= u < 1000 for u in first)
    assert cohort_ids(PFL_CIFAR10, 1) == first != cohort_ids(PFL_CIFAR10, 2)
    code = ("from fedforge.bench.pfl_cifar10 import PFL_CIFAR10, cohort_ids; "
            "print(cohort_ids(PFL_CIFAR10, 1))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == str(first)


@pytest.mark.parametrize("bad", ["", "fedforge,fedforge", "fedforge:gpu", "pfl:loop", "fl"])
def test_unknown_or_repeated_entries_are_refused_naming_the_option(bad):
    with pytest.raises(ValueError, match="--engines"):
        parse_frameworks(bad)


def test_pfl_procs_is_pfl_researchs_distributed_simulation_one_process_per_core():
    """``pfl:procs`` starts under torchrun with as many processes as fedforge's workers (the
    plain floor's count); every other row starts as ``python -m``."""
    from fedforge.engine.procs import default_workers

    assert parse_frameworks("pfl:procs,pfl,pfl:procs:bf16") == ["pfl:procs", "pfl",
                                                                 "pfl:procs:bf16"]
    assert pfl_cifar10.launcher("pfl") == pfl_cifar10.launcher("fedforge:procs") == ("-m",)
    torchrun = pfl_cifar10.launcher("pfl:procs")
    assert torchrun[:2] == ("-m", "torch.distributed.run") and torchrun[-1] == "-m"
    assert f"--nproc-per-node={default_workers()}" in torchrun


def test_quick_runs_every_row_and_the_table_has_every_column(tmp_path):
    names = ["fedforge", "plain", "pfl", "pfl:procs", "flower"]
    rows, note, versions = run_pfl_cifar10(
        names, tmp_path / "out", data_root=tmp_path / "no-data", groups=1, warmup=1,
        iterations=1, quick=True, peer_python=sys.executable)
    assert [r[0] for r in rows] == names and all(len(r) == len(HEADER) for r in rows)
    ran = {r[0]: r for r in rows if r[2] is not None}
    assert {"fedforge", "plain"} <= set(ran)
    for row in ran.values():
        it, ups, start, first, mem, acc, ratio = row[2:9]
        # it is rounded to 3 decimals, ups to 1: the bounds that rounding allows, at any speed
        assert it > 0 and (QUICK.cohort / (it + 5e-4) - 0.05 - 1e-9 <= ups
                           <= QUICK.cohort / max(it - 5e-4, 1e-12) + 0.05 + 1e-9)
        assert start > 0 and first > 0 and mem > 50 and 0 <= acc <= 1
        ref = ran["fedforge"][2]  # it and ref are rounded to 3 decimals, the ratio to 2
        assert (it - 5e-4) / (ref + 5e-4) - 5e-3 <= ratio <= (it + 5e-4) / (ref - 5e-4) + 5e-3
    for name in set(names) - set(ran):  # peers absent here: the reason, never a crash
        assert next(r for r in rows if r[0] == name)[1].startswith("not installed")
    assert "synthetic random images" in note and "torch" in versions
    text = record_results(tmp_path / "results", "pfl-cifar10", "fp32-quick",
                          "pfl-research CIFAR-10", HEADER, rows,
                          run_info(command="fedforge bench pfl-cifar10 --quick",
                                   versions=versions), [note])
    assert "| " + " | ".join(HEADER) + " |" in text and "torch " in text


def test_a_bf16_row_runs_in_bf16_beside_fp32_rows(tmp_path, monkeypatch):
    """``fedforge:procs:bf16`` and ``pfl`` in one interleaved run: the row's own precision
    reaches its process, the suffix never reaches the framework's engine name."""
    assert parse_frameworks("fedforge:procs:bf16,pfl,pfl:bf16") == [
        "fedforge:procs:bf16", "pfl", "pfl:bf16"]
    with pytest.raises(ValueError, match="--engines"):
        parse_frameworks("fedforge:bf16:procs")
    sent = {}
    monkeypatch.setattr(pfl_cifar10, "launch", lambda module, spec, stem, timeout_s,
                        python, launcher: (sent.update({stem.name: spec}), (0, "failed: stub"))[1])
    for name in ("fedforge:procs:bf16", "pfl"):
        pfl_cifar10.run_one(name, {"precision": "fp32"}, tmp_path, sys.executable, 1.0)
    assert sent["fedforge-procs-bf16"] == {"precision": "bf16", "framework": "fedforge:procs"}
    assert sent["pfl"] == {"precision": "fp32", "framework": "pfl"}


def test_lazy_images_are_the_normalised_rows():
    """Flower's actors read batches of the uint8 file normalised on access: the same values
    as the rows of the normalised array, bit for bit."""
    import numpy as np
    import torch

    from fedforge.bench.pfl_cifar10_run import LazyImages, normalised

    raw = np.random.default_rng(0).integers(0, 256, (7, 3, 4, 4), dtype=np.uint8)
    norm = (np.asarray([0.49, 0.48, 0.45], np.float32).reshape(1, 3, 1, 1),
            np.asarray([0.25, 0.24, 0.26], np.float32).reshape(1, 3, 1, 1))
    rows = torch.tensor([5, 0, 3])
    assert torch.equal(LazyImages(raw, norm)[rows], normalised(raw, norm)[rows])
    assert not torch.equal(normalised(raw, norm)[rows], normalised(raw, norm)[[5, 0, 2]])


def test_another_seed_is_another_sample_of_the_same_workload(tmp_path, monkeypatch):
    """``--seed`` changes the cohorts and the initial weights, nothing else, and reaches every
    framework's process through the workload it is sent."""
    from dataclasses import replace

    from fedforge.bench.pfl_cifar10_run import initial_model

    other = replace(PFL_CIFAR10, seed=3)
    assert cohort_ids(other, 1) != cohort_ids(PFL_CIFAR10, 1)
    w0, w3 = (next(initial_model(w).parameters()) for w in (PFL_CIFAR10, other))
    assert w0.shape == w3.shape and not w0.equal(w3)
    sent = []
    monkeypatch.setattr(pfl_cifar10, "run_one",
                        lambda name, spec, *a, **k: sent.append(spec["work"]["seed"]))
    with pytest.raises(AttributeError):  # the stub returns no run: only what is sent counts
        run_pfl_cifar10(["plain"], tmp_path, quick=True, groups=1, seed=3,
                        data_root=tmp_path / "no-data")
    assert sent and set(sent) == {3}
