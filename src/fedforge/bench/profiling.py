"""``--profile``: a torch profiler trace of a run or benchmark and its top kernels.

The trace (Chrome trace format, open it in ``chrome://tracing`` or Perfetto) and a text table
of the kernels with the most self time go into the given folder, so a profile never lands
outside the run's (or benchmark's) own directory.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from fedforge.experiment.rundir import write_bytes, write_text


def top_kernels(prof: profile, limit: int = 15) -> str:
    """The ``limit`` operators with the most self time (CPU, or CUDA when profiled)."""
    sort = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=sort, row_limit=limit)


@contextlib.contextmanager
def profiled(folder: str | Path, name: str = "profile", *, enabled: bool = True,
             limit: int = 15) -> Iterator[None]:
    """Profile the block; write ``folder/name.trace.json`` and ``folder/name.top.txt`` and
    print the top kernels. A no-op when ``enabled`` is false."""
    if not enabled:
        yield
        return
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        yield
    with tempfile.TemporaryDirectory() as scratch:  # torch writes the trace by path only
        trace = Path(scratch) / "trace.json"
        prof.export_chrome_trace(str(trace))
        path = write_bytes(folder, f"{name}.trace.json", trace.read_bytes())
    table = top_kernels(prof, limit)
    write_text(folder, f"{name}.top.txt", table + "\n")
    print(f"profile: {path}\n{table}", flush=True)
