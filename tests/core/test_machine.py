"""The CPU as ``/proc/cpuinfo`` describes it: features, cores, and unknown where unread."""

from __future__ import annotations

from fedforge.core.machine import FEATURES, features_text, parse_cpuinfo, read_cpu

# two physical cores, the first with two hyper-threads: three logical CPUs
CPUINFO = """\
processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8480+
physical id\t: 0
core id\t\t: 0
flags\t\t: fpu sse2 avx avx2 avx512f amx_bf16 amx_tile amx_int8

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
physical id\t: 0
core id\t\t: 0
flags\t\t: fpu sse2 avx avx2 avx512f amx_bf16 amx_tile amx_int8

processor\t: 2
model name\t: Intel(R) Xeon(R) Platinum 8480+
physical id\t: 0
core id\t\t: 1
flags\t\t: fpu sse2 avx avx2 avx512f amx_bf16 amx_tile amx_int8
"""


def test_features_and_cores_from_a_canned_cpuinfo():
    cpu = parse_cpuinfo(CPUINFO)
    assert cpu.model == "Intel(R) Xeon(R) Platinum 8480+"
    # avx512f is not avx512_bf16: a substring match would say yes
    assert cpu.features == {"amx_bf16": True, "amx_tile": True, "avx512_bf16": False,
                            "avx2": True}
    assert cpu.physical_cores == 2 and cpu.logical_cores == 3  # hyper-threads count once
    assert parse_cpuinfo(CPUINFO, logical_cores=8).logical_cores == 8
    assert features_text(cpu.features) == ("AMX-BF16 yes, AMX-TILE yes, AVX-512-BF16 no, "
                                           "AVX2 yes")


def test_nothing_read_is_unknown_never_no(tmp_path):
    cpu = read_cpu(tmp_path / "absent")
    assert cpu.model is None and cpu.physical_cores is None
    assert cpu.features == dict.fromkeys(FEATURES)
    assert features_text(cpu.features).count("unknown") == len(FEATURES)
    # a VM without topology lines: cores unknown, not the count of its CPUs
    flat = parse_cpuinfo("processor\t: 0\nflags\t\t: avx2\n\nprocessor\t: 1\nflags\t\t: avx2\n")
    assert flat.physical_cores is None and flat.logical_cores == 2
    assert flat.features["avx2"] is True and flat.features["amx_bf16"] is False


def test_native_bf16_needs_amx_or_avx512_bf16_and_is_unknown_when_unread():
    from fedforge.core.machine import native_bf16

    def cpu(flags: str):
        return parse_cpuinfo(f"processor\t: 0\nflags\t\t: {flags}\n")

    assert native_bf16(cpu("avx2 amx_bf16 amx_tile")) is True
    assert native_bf16(cpu("avx2 avx512f avx512_bf16")) is True
    assert native_bf16(cpu("avx2 avx512f amx_tile")) is False  # tiles without bf16
    assert native_bf16(cpu("avx avx2 fma")) is False
    assert native_bf16(parse_cpuinfo("", 2)) is None
