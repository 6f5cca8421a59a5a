"""One builder makes every engine (``fedforge.engine.build``), from the ``[engine]`` section and
explicit flags: the Python API and the ``fedforge`` command get the same engine for the same
section and flags, robust runs ask for the per-client deltas when the engine is built, and
``auto`` starts worker processes only where the caller allows them."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from fedforge.engine import (
    ENGINE_NAMES,
    AutoEngine,
    LoopEngine,
    ProcessEngine,
    VmapEngine,
    build_engine,
    build_job_engine,
)
from fedforge.experiment.config import EngineConfig, load_config
from fedforge.experiment.runner import Experiment

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.toml"


def test_every_config_engine_name_has_a_builder():
    assert set(ENGINE_NAMES) == set(EngineConfig.model_fields["name"].annotation.__args__)


@pytest.mark.parametrize("name", ENGINE_NAMES)
@pytest.mark.parametrize("allow", [False, True])
def test_the_section_and_flags_reach_the_engine(name, allow):
    section = EngineConfig(name=name, chunk_size=3)
    engine = build_engine(section, allow_processes=allow, keep_deltas=True, budget_updates=7)
    assert engine.name == name and engine.keep_deltas is True
    assert build_engine(section, allow_processes=allow).keep_deltas is False
    if name == "auto":
        assert (engine.allow_processes, engine.budget_updates) == (allow, 7)
    if name != "loop":  # the loop runs one client at a time
        assert engine._chunk == 3


def test_an_unknown_engine_is_refused_in_one_line():
    section = SimpleNamespace(name="jax", chunk_size="auto", compile=False)
    for build in (lambda: build_engine(section, allow_processes=True),
                  lambda: build_job_engine(section)):
        with pytest.raises(ValueError, match=r"^engine.name: unknown engine 'jax'; expected "
                                             r"one of \['auto', 'distributed', 'loop'"):
            build()


@pytest.mark.parametrize(("name", "kind"), [("loop", LoopEngine), ("procs", ProcessEngine),
                                            ("vmap", VmapEngine), ("auto", VmapEngine),
                                            ("distributed", VmapEngine)])
def test_the_job_engine_of_each_section(name, kind):
    engine = build_job_engine(EngineConfig(name=name, chunk_size=5))
    assert type(engine) is kind
    if kind is VmapEngine:
        assert engine._chunk == 5


def test_a_robust_run_builds_its_engine_keeping_deltas():
    honest = Experiment.from_config(load_config(QUICKSTART, ["engine.name=loop"]))
    robust = Experiment.from_config(load_config(QUICKSTART, ["engine.name=loop",
                                                             "server.aggregator=median"]))
    assert honest.engine.keep_deltas is False and robust.engine.keep_deltas is True


def test_python_api_allows_processes_only_when_asked():
    cfg = load_config(QUICKSTART, ["engine.name=auto"])
    assert Experiment.from_config(cfg).engine.allow_processes is False
    assert Experiment.from_config(cfg, allow_processes=True).engine.allow_processes is True
    assert isinstance(Experiment.from_config(cfg).engine, AutoEngine)


def test_the_command_allows_processes(monkeypatch, tmp_path):
    """``fedforge run`` passes ``allow_processes=True``; nothing is read from ``sys.argv``."""
    from fedforge import cli
    from fedforge.experiment import runner

    seen = {}

    def fake(cfg, out, **kwargs):
        seen.update(kwargs)
        raise ValueError("stop here")

    monkeypatch.setattr(runner, "run_experiment", fake)
    out = CliRunner().invoke(cli.app, ["run", str(QUICKSTART), "--out", str(tmp_path / "r")])
    assert "stop here" in out.output and seen["allow_processes"] is True
