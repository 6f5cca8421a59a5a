"""Refuse an allocation that cannot fit before making it.

Sizes that come from a config (clients, batch size, model width) are known before anything is
allocated, so a size past the memory the machine has left is one line naming the field and
the bytes it would need, instead of a ``MemoryError`` traceback (or the OOM killer) later.
psutil is not a dependency: the host's free memory comes from ``/proc/meminfo`` (or the
container's cgroup limit), else the physical memory, else the check is skipped.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode


class AllocationError(ValueError):
    """A requested size needs more memory than is available (one line: field and size)."""


def format_bytes(nbytes: float) -> str:
    """``8.00 GiB``-style size for messages."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(nbytes) < 1024 or unit == "PiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.2f} {unit}"
        nbytes /= 1024
    raise AssertionError("unreachable")


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_available() -> int | None:
    """Room left under a cgroup v2 memory limit (containers), if one is set."""
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit == "max":
            return None
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
        return max(int(limit) - used, 0)
    except (OSError, ValueError):
        return None


def _physical() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def available_memory(device: torch.device | str | None = None) -> int | None:
    """Bytes that can still be allocated on ``device`` (host memory by default); ``None``
    when it cannot be told, and then nothing is refused."""
    device = torch.device("cpu" if device is None else device)
    if device.type == "cuda":
        try:  # free on the card + what torch's cache holds but no tensor uses
            cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
            return int(torch.cuda.mem_get_info(device)[0]) + cached
        except (RuntimeError, AssertionError):
            return None
    if device.type != "cpu":
        return None
    known = [n for n in (_meminfo_available(), _cgroup_available()) if n is not None]
    return min(known) if known else _physical()


def check_allocation(nbytes: int, what: str, device: torch.device | str | None = None) -> None:
    """AllocationError ``"{what} need {size}; only {free} is available"`` when ``nbytes``
    exceeds the memory left on ``device``. ``what`` names the field and its value."""
    free = available_memory(device)
    if free is not None and nbytes > free:
        where = "" if device is None or torch.device(device).type == "cpu" else f" on {device}"
        raise AllocationError(f"{what} need {format_bytes(nbytes)}; only {format_bytes(free)} "
                              f"of memory is available{where}")


_OUT_OF_MEMORY = ("can't allocate memory", "not enough memory", "can't start new thread")
"""What torch's CPU allocator and Python's thread start say when the process may not grow:
under ``ulimit -v`` or a container limit, an allocation can fail although it fits the
``MemAvailable`` the checks above read."""


def out_of_memory(exc: BaseException) -> str | None:
    """One line saying memory ran out, when ``exc`` (or an exception it was raised from) is a
    failed allocation; else ``None``, and the caller re-raises."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        text = " ".join(str(exc).split())
        if isinstance(exc, MemoryError) or (
                isinstance(exc, RuntimeError) and any(s in text for s in _OUT_OF_MEMORY)):
            detail = re.sub(r"^\[[^]]*\]\s*", "", text) or type(exc).__name__
            return (f"out of memory ({detail[:200]}); this process may allocate less than "
                    "the machine's free memory (a ulimit -v or container limit)")
        exc = exc.__cause__ or exc.__context__
    return None


class _SkipFills(TorchFunctionMode):
    """In-place ops (``normal_``, ``uniform_``, ...) on meta tensors do nothing: there is no
    data to fill, and running them would import torch's decompositions (about a second)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        first = args[0] if args else next(iter(kwargs.values()), None)
        if (name.endswith("_") and not name.startswith("_")
                and isinstance(first, torch.Tensor) and first.is_meta):
            return first
        return func(*args, **kwargs)


def module_nbytes(build: Callable[[], torch.nn.Module]) -> tuple[int, int] | None:
    """``(parameters, bytes of parameters and buffers)`` of the module ``build()`` returns,
    built on the meta device (nothing allocated, the global RNG untouched); ``None`` when
    ``build`` cannot run there (e.g. it reads tensor values)."""
    try:
        with torch.device("meta"), _SkipFills():
            module = build()
    except Exception:  # noqa: BLE001 (any failure: the real build reports its own error)
        return None
    tensors = [*module.parameters(), *module.buffers()]
    return (sum(p.numel() for p in module.parameters()),
            sum(t.numel() * t.element_size() for t in tensors))
