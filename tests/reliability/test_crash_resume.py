"""SIGKILL a running ``fedforge run`` at random moments, resume, compare with an unbroken run.

The killed run is restarted with ``--resume`` until it finishes; its final model (the last
checkpoint's tensors) and its ``metrics.jsonl`` (minus wall-clock seconds) must equal an
uninterrupted run's bit for bit, and after every kill ``metrics.jsonl`` holds whole JSON lines
only. Kill moments are drawn from a seeded RNG: "after the k-th metrics line plus a random
delay", k random, so the kills land inside training, evaluation and checkpoint writes
rather than during the interpreter's start-up (the slow variant also kills during start-up).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fedforge.algorithms import build_algorithm
from fedforge.study.labels import without_wall_clock

CONFIG = """
name = "crash"
seed = 7
rounds = {rounds}
[data]
dataset = "synthetic"
partition = "natural"
options = {{ num_clients = 12, alpha = 0.5, beta = 0.5 }}
[model]
name = "logreg"
[algorithm]
name = "{algorithm}"
local_lr = 0.05
[client]
batch_size = 8
local_steps = 4
[server]
clients_per_round = {per_round}
[eval]
every = 1
per_client = false
[checkpoint]
every = 3
keep = 2
{extra}"""
VARIANTS = {  # extra config tables: random attackers under a median, straggler rounds
    "plain": "",
    "random_attack": '[attack]\nkind = "random"\nfraction = 0.25\n',
    "stragglers": "[sim]\nstragglers = true\nstraggler_k = 3\n",
}


def _env() -> dict:
    # same intra-op thread count as this process, so the in-process reference matches
    return {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}


def _cmd(cfg: Path, out: Path, resume: bool) -> list[str]:
    return [sys.executable, "-m", "fedforge", "run", str(cfg), "--out", str(out), "-q",
            *(["--resume"] if resume else [])]


def _lines(out: Path) -> list[str]:
    path = out / "metrics.jsonl"
    return path.read_text().splitlines(keepends=True) if path.is_file() else []


def _assert_whole_lines(out: Path) -> None:
    for line in _lines(out):
        assert line.endswith("\n"), f"torn line {line!r}"
        json.loads(line)


def _kill_at(cfg: Path, out: Path, resume: bool, after_lines: int | None, delay: float) -> bool:
    """Start a run; SIGKILL it ``delay`` s after metrics.jsonl has ``after_lines`` lines (None:
    ``delay`` s after start). -> whether the run was killed (False: it finished first)."""
    proc = subprocess.Popen(_cmd(cfg, out, resume), env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    try:
        while after_lines is not None and len(_lines(out)) < after_lines:
            if proc.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.005)
        time.sleep(delay)
        if proc.poll() is not None:
            assert proc.returncode == 0, proc.stderr.read()
            return False
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        return True
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _final(out: Path, rounds: int) -> tuple[list[dict], dict]:
    records = [without_wall_clock(json.loads(x)) for x in _lines(out)]
    tensors = load_file(str(out / "checkpoints" / f"round_{rounds:05d}.safetensors"))
    return records, tensors


def _reference(tmp_path: Path, cfg: Path, rounds: int, in_process: bool):
    out = tmp_path / "reference"
    if in_process:
        from fedforge.experiment.config import load_config
        from fedforge.experiment.runner import run_experiment

        run_experiment(load_config(cfg), out, progress=False)
    else:
        subprocess.run(_cmd(cfg, out, False), env=_env(), check=True, capture_output=True)
    return _final(out, rounds)


def _crash_and_compare(tmp_path: Path, rounds: int, kills: int, seed: int, in_process: bool,
                       startup_kill: bool = False, algorithm: str = "scaffold",
                       variant: str = "plain") -> int:
    cfg = tmp_path / "crash.toml"
    per_round = 12 if "full_participation" in build_algorithm(algorithm).requires else 4
    cfg.write_text(CONFIG.format(rounds=rounds, algorithm=algorithm, extra=VARIANTS[variant],
                                 per_round=per_round))
    rng = random.Random(seed)
    out = tmp_path / "killed"
    killed, resume = 0, False
    if startup_kill:  # a kill while the interpreter is still importing / building data
        killed += _kill_at(cfg, out, False, None, rng.uniform(0.0, 1.5))
        _assert_whole_lines(out)
    for _ in range(kills):
        done = len(_lines(out))
        # a kill moment a few rounds ahead, never in the last 5 rounds (the run would finish
        # before the kill lands and the kill count would depend on machine speed)
        target = min(done + rng.randint(1, 10), rounds - 5)
        killed += _kill_at(cfg, out, resume or killed > 0, target, rng.uniform(0.0, 0.03))
        _assert_whole_lines(out)
        resume = True
    proc = subprocess.run(_cmd(cfg, out, True), env=_env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    records, tensors = _final(out, rounds)
    ref_records, ref_tensors = _reference(tmp_path, cfg, rounds, in_process)
    assert [r["round"] for r in records] == list(range(1, rounds + 1))
    assert records == ref_records
    assert tensors.keys() == ref_tensors.keys()
    for k in tensors:
        assert torch.equal(tensors[k], ref_tensors[k]), k
    return killed


def test_sigkill_and_resume_bit_exact_fast(tmp_path):
    """CI variant: one kill at a random moment of a 20-round run (two subprocesses)."""
    assert _crash_and_compare(tmp_path, rounds=20, kills=1, seed=0, in_process=True) == 1


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sigkill_many_times_bit_exact(tmp_path, seed):
    """Six kills (one during start-up) of a 60-round run; reference is a subprocess too."""
    assert _crash_and_compare(tmp_path, rounds=60, kills=5, seed=seed, in_process=False,
                              startup_kill=True) >= 3


def _registry_cases():
    from fedforge.algorithms import ALGORITHMS

    cases = [(name, "plain") for name in sorted(ALGORITHMS)]
    # attackers and stragglers change who is aggregated: one stateless, one stateful with
    # per-client state, one codec algorithm
    cases += [(name, v) for name in ("fedavg", "scaffold", "topk_ef")
              for v in ("random_attack", "stragglers")]
    return cases


@pytest.mark.slow
@pytest.mark.parametrize(("algorithm", "variant"), _registry_cases(),
                         ids=[f"{a}-{v}" for a, v in _registry_cases()])
def test_sigkill_and_resume_bit_exact_for_every_algorithm(tmp_path, algorithm, variant):
    """One kill at a random moment of a 9-round run, for every registered algorithm."""
    seed = sum(map(ord, algorithm + variant))
    _crash_and_compare(tmp_path, rounds=9, kills=1, seed=seed, in_process=True,
                       algorithm=algorithm, variant=variant)
