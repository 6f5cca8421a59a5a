"""Where datasets are read from: ``--data-root``, then ``data.root``, then ``$FEDFORGE_DATA``,
then ``./data``, then ``../shared/data`` beside the repository; a missing dataset is one line.

The CSV example's dataset (examples/plugins/data, a few KB) stands in for a real one, so these
tests run on every machine.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import fedforge
from fedforge.cli import app
from fedforge.data import DatasetError, load_dataset
from fedforge.data import root as data_root
from fedforge.data.loaders import _REGISTRY  # noqa: PLC2701

ROOT = Path(__file__).resolve().parents[1]
CSV_ROOT = ROOT / "examples" / "plugins" / "data"
CONFIG = ROOT / "examples" / "plugins" / "blobs_dirichlet.toml"


@pytest.fixture(autouse=True)
def clean(monkeypatch, tmp_path):
    """No --data-root, no $FEDFORGE_DATA, defaults inside tmp_path; the CSV dataset loaded."""
    saved = dict(_REGISTRY)
    monkeypatch.delenv("FEDFORGE_DATA", raising=False)
    monkeypatch.setattr(data_root, "DEFAULT_ROOTS", (Path("data"), tmp_path / "shared"))
    monkeypatch.chdir(tmp_path)
    fedforge.load_plugins([str(ROOT / "examples/plugins/csv_dataset_plugin.py")])
    yield
    data_root.use_data_root(None)
    _REGISTRY.clear()
    _REGISTRY.update(saved)
    sys.modules.pop("csv_dataset_plugin", None)  # the next test imports it afresh


def test_resolution_order(monkeypatch, tmp_path):
    (tmp_path / "shared").mkdir()
    assert data_root.resolve_data_root() == (tmp_path / "shared", "default")
    (tmp_path / "data").mkdir()
    assert data_root.resolve_data_root() == (Path("data"), "default")  # ./data first
    monkeypatch.setenv("FEDFORGE_DATA", "/env")
    assert data_root.resolve_data_root() == (Path("/env"), "$FEDFORGE_DATA")
    assert data_root.resolve_data_root("/cfg") == (Path("/cfg"), "data.root")  # beats the env
    data_root.use_data_root("/cli")
    assert data_root.resolve_data_root("/cfg") == (Path("/cli"), "--data-root")  # beats all


def test_no_root_at_all_names_the_default(tmp_path):
    assert data_root.resolve_data_root() == (Path("data"), "default")
    with pytest.raises(DatasetError) as err:
        load_dataset("mnist")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"dataset 'mnist': {tmp_path / 'data' / 'mnist'}/ not found "
                              f"(data root {tmp_path / 'data'} (from default)); looked for "
                              "train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
                              "t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz; get the "
                              "four original MNIST IDX .gz files")
    assert message.endswith("or point --data-root, data.root or $FEDFORGE_DATA at the folder "
                            "holding mnist/ (README.md: Where your data lives)")


def test_env_variable_and_missing_file(monkeypatch, tmp_path):
    monkeypatch.setenv("FEDFORGE_DATA", str(CSV_ROOT))
    assert load_dataset("blobs_csv").num_train == 300  # no root anywhere but the variable
    partial = tmp_path / "partial" / "blobs_csv"
    partial.mkdir(parents=True)
    (partial / "train.csv").write_text((CSV_ROOT / "blobs_csv" / "train.csv").read_text())
    with pytest.raises(DatasetError, match=r"^dataset 'blobs_csv': .*partial/blobs_csv/test\.csv: "
                                           r"file not found \(data root .*partial \(from "
                                           r"data\.root\)\)"):
        load_dataset("blobs_csv", tmp_path / "partial")


def _run(*args: str):
    return CliRunner().invoke(app, ["run", str(CONFIG), "rounds=1", "-q", *args])


def test_cli_data_root_wins_over_the_config_and_the_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("FEDFORGE_DATA", str(tmp_path))  # empty: would fail
    monkeypatch.chdir(ROOT)  # the config's plugin path is relative to the repository
    result = _run(f"data.root={tmp_path}", "--data-root", str(CSV_ROOT),
                  "--out", str(tmp_path / "ok"))
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "ok" / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["round"] == 1


def test_cli_missing_dataset_is_one_line(monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    result = _run("--data-root", str(tmp_path), "--out", str(tmp_path / "bad"))
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"error: dataset 'blobs_csv': {tmp_path / 'blobs_csv'}/ not found (data root "
        f"{tmp_path} (from --data-root)); looked for train.csv, test.csv; get "
        "examples/plugins/data/blobs_csv")
    result = _run("--data-root", str(tmp_path / "nowhere"), "--out", str(tmp_path / "bad2"))
    assert result.exit_code == 2
    assert result.output.strip() == (f"error: --data-root: directory "
                                      f"'{tmp_path / 'nowhere'}' does not exist")
