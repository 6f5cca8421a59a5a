"""Every shipped example config loads and validates (a renamed hparam or model breaks this)."""

from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from fedforge.experiment.config import load_config, validate
from fedforge.experiment.multitask import load_multitask

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.toml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_config_validates(path, monkeypatch):
    monkeypatch.chdir(ROOT)  # data roots in examples are relative to the repository
    raw = tomllib.loads(path.read_text())
    roots = [t.get("data", {}).get("root") for t in raw.get("tasks", [raw])]
    missing = [r for r in roots if r and not (ROOT / r).is_dir()]
    if missing:
        pytest.skip(f"dataset folder {missing[0]} is absent on this machine")
    if "tasks" in raw:
        assert load_multitask(path).tasks
    else:
        validate(load_config(path, []))


def test_there_are_examples():
    assert any(p.name == "quickstart.toml" for p in EXAMPLES)
