"""A bf16 run on a CPU that only emulates bf16 says so on its first line, and only there."""

from __future__ import annotations

from fedforge.core.machine import parse_cpuinfo
from fedforge.experiment.config import SingleTaskConfig
from fedforge.experiment.progress import bf16_hint

NO = parse_cpuinfo("processor\t: 0\nflags\t\t: avx avx2 fma\n")
YES = parse_cpuinfo("processor\t: 0\nflags\t\t: avx2 amx_bf16 amx_tile\n")
UNREAD = parse_cpuinfo("", 2)


def _cfg(**engine) -> SingleTaskConfig:
    return SingleTaskConfig.model_validate({"engine": {"device": "cpu", **engine}})


def test_bf16_on_an_emulating_cpu_is_named_and_nothing_else_is():
    hint = bf16_hint(_cfg(precision="bf16"), NO)
    assert hint.startswith("bf16 on a CPU without AMX or AVX-512-BF16: ")
    assert bf16_hint(_cfg(precision="bf16_sr"), NO) == hint
    assert bf16_hint(_cfg(precision="bf16"), YES) == ""
    assert bf16_hint(_cfg(precision="bf16"), UNREAD) == ""  # unread: no guess
    assert bf16_hint(_cfg(precision="fp32"), NO) == ""
    assert bf16_hint(_cfg(precision="tf32"), NO) == ""


def test_a_bf16_base_model_counts_as_bf16():
    cfg = SingleTaskConfig.model_validate({"engine": {"device": "cpu"},
                                    "model": {"name": "pretrained",
                                              "options": {"precision": "bf16"}}})
    assert bf16_hint(cfg, NO) != ""
    cfg = SingleTaskConfig.model_validate({"engine": {"device": "cpu"},
                                    "model": {"name": "pretrained",
                                              "options": {"precision": "float32"}}})
    assert bf16_hint(cfg, NO) == ""


def test_a_multi_task_config_is_read_by_its_engine_only():
    from pathlib import Path

    from fedforge.experiment.config import load_config

    root = Path(__file__).resolve().parents[2]
    cfg = load_config(root / "examples" / "fedast_cpu_2tasks.toml")
    assert not hasattr(cfg, "model")
    assert bf16_hint(cfg, NO) == ""
    bf16 = cfg.model_copy(update={"engine": cfg.engine.model_copy(update={"precision": "bf16",
                                                                          "device": "cpu"})})
    assert bf16_hint(bf16, NO) != ""
