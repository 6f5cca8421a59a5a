"""Kill a disk-store run at any moment, resume: the same run bit for bit.

A kill can land between a round's rows reaching the live files and the next checkpoint, or
between a segment's write and the checkpoint JSON that names it; either way the resumed run
must ignore those rows. The fast test stops a run exactly there (the checkpoint write fails
after the segment is on disk); the slow ones SIGKILL ``fedforge run`` at random moments, with
the kill loop of ``test_crash_resume.py``, for SCAFFOLD and for every registered algorithm.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedforge.core.checkpoint import load_checkpoint
from fedforge.core.tree import flatten_dict
from fedforge.experiment import runner
from fedforge.experiment.config import load_config
from fedforge.study.labels import without_wall_clock
from tests.reliability import test_crash_resume as crash

ROOT = Path(__file__).resolve().parents[2]
DISK = '[engine]\nclient_store = "disk"\n'


def _cfg(*extra: str):
    return load_config(ROOT / "examples/quickstart.toml", [
        "rounds=5", "eval.every=1", "checkpoint.every=2", "data.options.num_clients=8",
        "server.clients_per_round=3", "client.batch_size=5", "client.local_epochs=null",
        "client.local_steps=2", "eval.per_client=false", "engine.name=vmap",
        "algorithm.name=scaffold", *extra])


def _metrics(run: Path) -> list[dict]:
    return [without_wall_clock(json.loads(x))
            for x in (run / "metrics.jsonl").read_text().splitlines()]


class _Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs (not even ``except Exception``)."""


def test_rows_and_segments_after_the_last_checkpoint_are_ignored(tmp_path, monkeypatch):
    memory, disk = tmp_path / "memory", tmp_path / "disk"
    runner.run_experiment(_cfg("engine.client_store=memory"), memory, progress=False)
    save = runner.save_checkpoint

    def dies_at_round_4(directory, round_, tensors, meta, keep=2):
        if round_ == 4:  # the store has written segment ..._00004 already
            raise _Killed
        return save(directory, round_, tensors, meta, keep=keep)

    monkeypatch.setattr(runner, "save_checkpoint", dies_at_round_4)
    with pytest.raises(_Killed):
        runner.run_experiment(_cfg("engine.client_store=disk"), disk, progress=False)
    segments = sorted(p.name for p in (disk / "clients").glob("segment_*"))
    assert segments[-1].endswith("_00004.safetensors")  # written, never named by a checkpoint
    monkeypatch.setattr(runner, "save_checkpoint", save)
    runner.run_experiment(_cfg("engine.client_store=disk"), disk, resume=True, progress=False)
    assert _metrics(disk) == _metrics(memory)
    a, _ = load_checkpoint(memory / "checkpoints")
    b, meta = load_checkpoint(disk / "checkpoints")
    a.pop("clients", None)
    a, b = flatten_dict(a), flatten_dict(b)
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    named = {s["file"] for s in meta["store"]["ranks"][0]}
    assert {p.name for p in (disk / "clients").glob("segment_*")} >= named


@pytest.fixture
def disk_variant(monkeypatch):
    monkeypatch.setitem(crash.VARIANTS, "disk", DISK)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_sigkill_and_resume_a_disk_store_run_bit_exact(tmp_path, disk_variant, seed):
    """Several kills (one during start-up) of a 30-round SCAFFOLD run on the disk store."""
    assert crash._crash_and_compare(tmp_path, rounds=30, kills=3, seed=seed, in_process=True,
                                    startup_kill=True, variant="disk") >= 1


def _names():
    from fedforge.algorithms import ALGORITHMS

    return sorted(ALGORITHMS)


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", _names())
def test_sigkill_and_resume_bit_exact_for_every_algorithm_on_disk(tmp_path, disk_variant,
                                                                   algorithm):
    """One kill at a random moment of a 9-round disk-store run, for every algorithm."""
    crash._crash_and_compare(tmp_path, rounds=9, kills=1, seed=sum(map(ord, algorithm)),
                             in_process=True, algorithm=algorithm, variant="disk")
