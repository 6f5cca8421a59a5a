"""How many intra-op threads a run's training uses (``[engine] threads``).

More threads than free cores is the slow case on a shared CPU: each op waits for its
slowest thread, and a thread that loses its core stalls the op. The default, ``auto``, is
therefore the number of *physical* cores this process may run on (hyper-threads share a
core's arithmetic units and add little to a conv net), never more than torch already uses:

* a count set before the run is kept when it is lower: ``OMP_NUM_THREADS`` (any value: it is
  the user's word), or a ``torch.set_num_threads`` call in the same Python process;
* worker processes (``engine.name = "procs"``, and ``auto`` when it chooses them) always run
  one thread each: the workers are the parallelism, one per core;
* an integer ``threads = N`` sets N in the process that trains, whatever else was set.

The choice is made when the engine is built, once per run, and the run's first progress
line shows it with its reason (:func:`describe_threads`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, NamedTuple

import torch

ThreadsSetting = int | Literal["auto"]
_SYS_CPU = Path("/sys/devices/system/cpu")


class ThreadChoice(NamedTuple):
    threads: int
    reason: str  # why this count, for the run's first progress line


_chosen: ThreadChoice | None = None  # the last choice applied in this process


def usable_cpus() -> list[int]:
    """The logical CPUs this process may run on: its affinity mask where the OS has one."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return list(range(os.cpu_count() or 1))


def physical_cores(cpus: list[int] | None = None, sys_cpu: Path = _SYS_CPU) -> int:
    """The physical cores among ``cpus`` (default: :func:`usable_cpus`), from Linux's
    ``/sys`` topology (one core per distinct package and core id); without it, the count of
    logical CPUs, the best portable guess."""
    cpus = usable_cpus() if cpus is None else cpus
    cores = set()
    for cpu in cpus:
        topology = sys_cpu / f"cpu{cpu}" / "topology"
        try:
            cores.add(((topology / "physical_package_id").read_text().strip(),
                       (topology / "core_id").read_text().strip()))
        except OSError:  # no /sys (macOS, Windows, some containers): logical CPUs
            return max(1, len(cpus))
    return max(1, len(cores))


def choose_threads(setting: ThreadsSetting = "auto", *, current: int | None = None,
                   environ: dict[str, str] | None = None, cores: int | None = None
                   ) -> ThreadChoice:
    """The intra-op threads for ``setting`` (see the module docstring for the rule);
    ``current``/``environ``/``cores`` default to this process's (tests pass their own)."""
    if setting != "auto":
        if not isinstance(setting, int) or isinstance(setting, bool) or setting < 1:
            raise ValueError(f"engine.threads: expected 'auto' or an integer >= 1, got "
                             f"{setting!r}")
        return ThreadChoice(setting, "engine.threads")
    current = torch.get_num_threads() if current is None else current
    environ = os.environ if environ is None else environ
    omp = environ.get("OMP_NUM_THREADS", "").strip()
    if omp:
        return ThreadChoice(current, f"OMP_NUM_THREADS={omp}")
    cores = physical_cores() if cores is None else cores
    if current < cores:
        return ThreadChoice(current, "set before the run (torch.set_num_threads)")
    return ThreadChoice(cores, "the physical cores this process may use")


def apply_threads(setting: ThreadsSetting = "auto") -> ThreadChoice:
    """Choose the threads for ``setting`` and set them in this process (remembered for
    :func:`describe_threads`)."""
    global _chosen
    choice = choose_threads(setting)
    if torch.get_num_threads() != choice.threads:
        torch.set_num_threads(choice.threads)
    _chosen = choice
    return choice


def busy_hint(threads: int, load: float | None = None, cores: int | None = None) -> str:
    """A hint for a multi-threaded run on a CPU other jobs already keep busy (load above the
    cores): there, a thread that loses its core stalls every op, and one thread is often
    several times faster. Only a hint: the count is never changed by the load, so that the
    same config runs the same way on every rerun."""
    if threads <= 1:
        return ""
    load = os.getloadavg()[0] if load is None and hasattr(os, "getloadavg") else load
    cores = physical_cores() if cores is None else cores
    if load is None or load <= cores:
        return ""
    return (f"; the CPU is busy (load {load:.1f} on {cores} cores): engine.threads=1 may be "
            "several times faster")


def describe_threads(engine: str = "auto") -> str:
    """``threads 2 (the physical cores this process may use)``: the run's choice, for its
    first progress line; the procs engine adds that its workers run one thread each, and a
    busy CPU adds :func:`busy_hint`."""
    choice = _chosen or ThreadChoice(torch.get_num_threads(), "torch's default")
    text = f"threads {choice.threads} ({choice.reason})"
    if engine == "procs":
        return text + ", 1 in each worker process"
    return text + busy_hint(choice.threads)
