"""What a benchmark ran on: the CPU's model, the features its speed depends on and its cores.

The one place that reads ``/proc/cpuinfo``, so every table and check names the same features
the same way. A feature is ``True`` or ``False`` only where the machine said so; where it
could not be read it is ``None`` (unknown), never a guess.
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

FEATURES: dict[str, str] = {"amx_bf16": "AMX-BF16", "amx_tile": "AMX-TILE",
                            "avx512_bf16": "AVX-512-BF16", "avx2": "AVX2"}
"""``/proc/cpuinfo`` flag -> the name a table prints. bf16 speed hangs on the first three
(AMX tiles and AVX-512-BF16 run bf16 GEMMs natively), fp32 speed on AVX2 and wider."""


@dataclass(frozen=True)
class Cpu:
    """A CPU as read: ``None`` where the source did not say."""

    model: str | None
    features: dict[str, bool | None]
    physical_cores: int | None
    logical_cores: int | None


def parse_cpuinfo(text: str, logical_cores: int | None = None) -> Cpu:
    """The :class:`Cpu` described by the text of ``/proc/cpuinfo``. Physical cores are the
    distinct (``physical id``, ``core id``) pairs, so hyper-threads count once; where the
    text has no such pairs they are unknown. ``logical_cores`` defaults to the text's
    ``processor`` entries."""
    blocks = [dict(_fields(block)) for block in text.split("\n\n") if block.strip()]
    cpus = [b for b in blocks if "processor" in b]
    flags = {f for b in cpus for f in b.get("flags", "").split()}
    features = {name: (name in flags) if flags else None for name in FEATURES}
    cores = {(b["physical id"], b["core id"]) for b in cpus
             if "physical id" in b and "core id" in b}
    model = next((b["model name"] for b in cpus if b.get("model name")), None)
    return Cpu(model, features, len(cores) or None,
               logical_cores if logical_cores is not None else len(cpus) or None)


def _fields(block: str):
    for line in block.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            yield key.strip(), value.strip()


def read_cpu(path: str | Path = "/proc/cpuinfo") -> Cpu:
    """This machine's CPU; everything but the logical cores unknown where ``path`` cannot
    be read (another OS)."""
    try:
        text = Path(path).read_text()
    except OSError:
        text = ""
    return parse_cpuinfo(text, os.cpu_count())


def machine(device: str = "cpu", threads: int | None = None) -> dict:
    """The ``machine`` field of a result record: architecture, CPU model, features, cores,
    torch's intra-op threads (``threads``) and the device (a CUDA device's name)."""
    import torch

    name = torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu"
    return {"arch": platform.machine(), **asdict(read_cpu()), "device": name,
            "threads": threads if threads is not None else torch.get_num_threads()}


def features_text(features: dict[str, bool | None]) -> str:
    """e.g. ``AMX-BF16 no, AMX-TILE no, AVX-512-BF16 yes, AVX2 unknown``."""
    words = {True: "yes", False: "no", None: "unknown"}
    return ", ".join(f"{label} {words[features.get(flag)]}" for flag, label in FEATURES.items())


def native_bf16(cpu: Cpu | None = None) -> bool | None:
    """Whether the CPU multiplies bf16 in hardware (AMX-BF16 or AVX-512-BF16); ``None`` where
    its features could not be read. Without either, torch emulates bf16 matmuls: on a 2-core
    AVX2 EPYC a MiniLM LoRA round in bf16 took 25 times as long as in float32."""
    features = (cpu or read_cpu()).features
    flags = (features.get("amx_bf16"), features.get("avx512_bf16"))
    if any(flags):
        return True
    return None if None in flags else False
