"""``[engine] threads``: the default avoids more threads than cores, an explicit count wins,
and a run's first progress line says what was chosen."""

from __future__ import annotations

import io

import pytest
import torch

from fedforge.engine.build import build_engine
from fedforge.engine.threads import busy_hint, choose_threads, physical_cores
from fedforge.experiment.config import ConfigError, load_config
from fedforge.experiment.progress import RoundProgress


def _topology(tmp_path, cores: dict[int, tuple[int, int]]):
    """A fake /sys/devices/system/cpu: logical cpu -> (package id, core id)."""
    for cpu, (package, core) in cores.items():
        topo = tmp_path / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{package}\n")
        (topo / "core_id").write_text(f"{core}\n")
    return tmp_path


def test_physical_cores_count_hyperthread_siblings_once(tmp_path):
    sys_cpu = _topology(tmp_path, {0: (0, 0), 1: (0, 0), 2: (0, 1), 3: (0, 1), 4: (1, 0)})
    assert physical_cores([0, 1, 2, 3, 4], sys_cpu) == 3
    assert physical_cores([0, 1], sys_cpu) == 1  # the affinity mask: one core's two threads


def test_physical_cores_without_topology_count_logical_cpus(tmp_path):
    assert physical_cores([0, 1, 2], tmp_path) == 3


def test_auto_caps_torch_default_at_the_physical_cores():
    choice = choose_threads("auto", current=8, environ={}, cores=4)
    assert choice.threads == 4 and "physical cores" in choice.reason


def test_auto_keeps_omp_num_threads_even_above_the_cores():
    choice = choose_threads("auto", current=6, environ={"OMP_NUM_THREADS": "6"}, cores=4)
    assert choice == (6, "OMP_NUM_THREADS=6")


def test_auto_keeps_a_lower_count_set_before_the_run():
    assert choose_threads("auto", current=1, environ={}, cores=4).threads == 1


def test_an_explicit_count_wins():
    assert choose_threads(3, current=1, environ={"OMP_NUM_THREADS": "1"}, cores=2).threads == 3


def test_config_refuses_zero_threads():
    with pytest.raises(ConfigError, match="engine.threads"):
        load_config("examples/quickstart.toml", ["engine.threads=0"])


def test_building_the_engine_sets_the_threads_and_the_progress_line_shows_them(tmp_path):
    before = torch.get_num_threads()
    try:
        cfg = load_config("examples/quickstart.toml", ["engine.threads=1", "engine.name=loop"])
        build_engine(cfg.engine, allow_processes=False)
        assert torch.get_num_threads() == 1
        out = io.StringIO()
        bar = RoundProgress.for_run(cfg, tmp_path, enabled=True)
        bar.stream, bar.lines, bar._open_trackers = out, True, None
        with bar:
            pass
        assert "threads 1 (engine.threads)" in out.getvalue()
    finally:
        torch.set_num_threads(before)


def test_a_busy_cpu_gets_a_hint_for_one_thread_and_a_quiet_one_none():
    assert busy_hint(2, load=11.3, cores=2) == (
        "; the CPU is busy (load 11.3 on 2 cores): engine.threads=1 may be several times faster")
    assert busy_hint(2, load=2.0, cores=2) == ""  # load at the cores: not busy
    assert busy_hint(1, load=11.3, cores=2) == ""  # one thread already
