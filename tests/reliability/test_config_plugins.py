"""A config file cannot run code: its ``plugins`` list is never imported by loading it.

Plugins are code, so they come from the command line (``--plugin``), or from the config only
when the user passes ``--allow-config-plugins`` (``allow_plugins=True`` in Python). A config
whose plugins were not given stops with one line naming the field. The hostile plugins here
are ``this`` (prints the Zen of Python on import) and a ``.py`` file that writes a marker file
when imported; each check runs in a fresh interpreter, so an import cannot hide behind an
earlier one.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = (ROOT / "examples" / "quickstart.toml").read_text()
ZEN = "Beautiful is better than ugly"
TINY = ["rounds=1", "eval.every=1", "checkpoint.every=1", "server.clients_per_round=2"]


@pytest.fixture
def evil(tmp_path) -> Path:
    """A plugin file that leaves a marker when imported."""
    path = tmp_path / "evil_plugin.py"
    path.write_text("from pathlib import Path\n"
                    "Path(__file__).with_name('marker').write_text('imported')\n")
    return path


def _config(tmp_path: Path, plugins: list[str], name: str = "c.toml") -> Path:
    """The quickstart with a top-level ``plugins`` list."""
    path = tmp_path / name
    path.write_text(f"plugins = {plugins!r}\n".replace("'", '"') + QUICKSTART)
    return path


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, text=True,
                          capture_output=True, timeout=300)


def _fedforge(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedforge", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=300)


def _refused(proc: subprocess.CompletedProcess, name: str) -> None:
    """Exit 2 with one line naming ``plugins`` and both ways to give it."""
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: plugins: a config cannot import code"), lines[0]
    assert f"--plugin {name}" in lines[0] and "--allow-config-plugins" in lines[0]
    assert ZEN not in proc.stdout + proc.stderr


# --- Python: load_config never imports ----------------------------------------------------------
LOAD = """
import sys
from fedforge.experiment.config import ConfigError, load_config
assert "this" not in sys.modules
try:
    load_config({path!r}, {overrides!r})
except ConfigError as exc:
    print("REFUSED", exc)
print("IMPORTED" if "this" in sys.modules else "CLEAN")
"""


@pytest.mark.parametrize("kind", ["module", "file", "override"])
def test_load_config_imports_nothing(kind, tmp_path, evil):
    if kind == "override":  # a dotted override is merged before the check, and refused too
        config, overrides, name = _config(tmp_path, []), ['plugins=["this"]'], "this"
    else:
        name = "this" if kind == "module" else str(evil)
        config, overrides = _config(tmp_path, [name]), []
    proc = _python(LOAD.format(path=str(config), overrides=overrides), tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[-1] == "CLEAN" and ZEN not in proc.stdout
    assert lines[0].startswith("REFUSED plugins: a config cannot import code")
    assert f"--plugin {name}" in lines[0] and len(lines) == 2
    assert not (tmp_path / "marker").exists()


def test_compare_table_and_run_folder_import_nothing(tmp_path, evil):
    """A ``[compare.X]`` table and a planted ``config.resolved.toml`` are configs too."""
    table = tmp_path / "t.toml"
    table.write_text(QUICKSTART + f'\n[compare.fedprox]\nplugins = ["{evil}"]\n')
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _config(run_dir, [str(evil)], "config.resolved.toml")
    code = f"""
from fedforge.study.compare import comparison_configs
from fedforge.experiment.config import ConfigError
from fedforge.experiment.runner import Experiment
for load in (lambda: comparison_configs({str(table)!r}, ["fedprox"]),
             lambda: Experiment.load({str(run_dir)!r})):
    try:
        load()
    except ConfigError as exc:
        print("REFUSED", exc)
"""
    proc = _python(code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("REFUSED plugins:") for line in lines)
    assert not (tmp_path / "marker").exists()


def test_python_api_imports_when_asked(tmp_path, evil):
    """``allow_plugins=True`` imports the list; a plugin loaded first satisfies the config."""
    config = _config(tmp_path, [str(evil)])
    code = f"""
import fedforge
from fedforge.experiment.config import load_config
fedforge.load_plugins([{str(evil)!r}])
print(load_config({str(config)!r}).plugins)
"""
    proc = _python(code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "marker").read_text() == "imported"
    (tmp_path / "marker").unlink()
    code = (f"from fedforge.experiment.config import load_config\n"
            f"load_config({str(config)!r}, allow_plugins=True)\n")
    assert _python(code, tmp_path).returncode == 0
    assert (tmp_path / "marker").read_text() == "imported"


# --- the command line -------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["run", "compare", "pretrain"])
def test_cli_refuses_config_plugins(command, tmp_path, evil):
    config = _config(tmp_path, ["this", str(evil)])
    extra = ["-a", "fedavg"] if command == "compare" else []
    proc = _fedforge(command, str(config), *extra, *TINY, "--out", str(tmp_path / "out"),
                     cwd=tmp_path)
    _refused(proc, "this")
    assert f"--plugin {evil}" in proc.stderr
    assert not (tmp_path / "marker").exists()
    assert not (tmp_path / "out").exists()


def test_cli_runs_plugins_given_with_plugin(tmp_path, evil):
    """A config whose plugins are all given with --plugin runs (relative and absolute paths
    of one file are the same plugin)."""
    config = _config(tmp_path, ["evil_plugin.py"])
    proc = _fedforge("run", str(config), *TINY, "--plugin", str(evil), "--out",
                     str(tmp_path / "out"), "-q", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "marker").exists() and (tmp_path / "out" / "metrics.jsonl").is_file()


def test_cli_allow_config_plugins_imports_them(tmp_path, evil):
    config = _config(tmp_path, [str(evil)])
    proc = _fedforge("run", str(config), *TINY, "--allow-config-plugins", "--out",
                     str(tmp_path / "out"), "-q", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "marker").exists() and (tmp_path / "out" / "metrics.jsonl").is_file()
    bad = _fedforge("run", str(_config(tmp_path, ["no_such_plugin"], "bad.toml")),
                    "--allow-config-plugins", "--out", str(tmp_path / "bad"), cwd=tmp_path)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "error: plugins: plugin 'no_such_plugin' failed to import: ModuleNotFoundError: No "
        "module named 'no_such_plugin'"]


# --- Flower: the run config, not the fedforge config, names the plugins ------------------------
def test_flower_app_imports_only_run_config_plugins(tmp_path, evil):
    pytest.importorskip("flwr", reason="the Flower bridge needs `pip install 'fedforge[flower]'`")
    config = _config(tmp_path, [str(evil)])
    code = f"""
from fedforge.experiment.config import ConfigError
from fedforge.flower.app import config_from_run
try:
    config_from_run({{"fedforge-config": {str(config)!r}}})
except ConfigError as exc:
    print("REFUSED", exc)
import os
print("MARKER" if os.path.exists("marker") else "CLEAN")
print(config_from_run({{"fedforge-config": {str(config)!r},
                        "fedforge-plugins": {str(evil)!r}}}).plugins)
"""
    proc = _python(code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("REFUSED plugins: a config cannot import code")
    assert lines[1] == "CLEAN" and (tmp_path / "marker").exists()
