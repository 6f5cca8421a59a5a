"""``dataset = "huggingface"``: local Arrow, Parquet, CSV and image-folder datasets made here
load as fedforge tensors, train end to end with fedforge's and flwr-datasets' partitions and
per-client evaluation, and bad settings fail in one line naming the field. Nothing is fetched.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

datasets = pytest.importorskip("datasets")
pytest.importorskip("flwr_datasets")
PIL = pytest.importorskip("PIL.Image")

from fedforge.cli import app  # noqa: E402
from fedforge.data import DATASETS, DatasetError, build_federated_dataset, load_dataset  # noqa: E402
from fedforge.data.partition import label_matched_tests  # noqa: E402

N, CLASSES, WRITERS = 200, 4, 5


def _pixels(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """8x8 grey images whose brightness follows the label (learnable in two rounds)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, CLASSES, N)
    x = rng.integers(0, 60, (N, 8, 8)) + 50 * y[:, None, None]
    return x.astype(np.uint8), y


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    """One tiny dataset in every format, written by the test."""
    root = tmp_path_factory.mktemp("hf")
    x, y = _pixels()
    features = datasets.Features({"image": datasets.Image(),
                                  "label": datasets.ClassLabel(names=list("abcd")),
                                  "writer_id": datasets.Value("string")})
    ds = datasets.Dataset.from_dict(
        {"image": [PIL.fromarray(a) for a in x], "label": y.tolist(),
         "writer_id": [f"w{i % WRITERS}" for i in range(N)]}, features=features)
    ds.save_to_disk(str(root / "arrow"))
    ds.to_parquet(str(root / "data.parquet"))
    table = {f"p{i}": x.reshape(N, -1)[:, i] for i in range(64)}
    datasets.Dataset.from_dict({**table, "label": y}).to_csv(str(root / "data.csv"),
                                                               index=False)
    for split, rows in (("train", range(0, 12)), ("test", range(12, 18))):
        for i in rows:
            folder = root / "images" / split / f"class{y[i]}"
            folder.mkdir(parents=True, exist_ok=True)
            PIL.fromarray(np.stack([x[i]] * 3, -1)).save(folder / f"{i}.png")
    return {"arrow": root / "arrow", "parquet": root / "data.parquet",
            "csv": root / "data.csv", "imagefolder": root / "images"}


def _listing(path: Path) -> list[tuple[str, int]]:
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return [(str(p), p.stat().st_mtime_ns) for p in files]


# ----------------------------------------------------------------------------- loading


@pytest.mark.parametrize("fmt", ["arrow", "parquet", "csv"])
def test_each_format_loads_as_tensors(made, fmt):
    before = _listing(made[fmt])
    s = load_dataset("huggingface", path=str(made[fmt]))
    shape = (64,) if fmt == "csv" else (1, 8, 8)
    assert s.train_x.shape == (160, *shape) and s.test_x.shape == (40, *shape)
    assert s.train_x.dtype == torch.float32 and s.train_y.dtype == torch.int64
    assert s.num_classes == CLASSES and s.input_shape == shape
    assert abs(float(s.train_x.mean())) < 1e-3 and abs(float(s.train_x.std()) - 1) < 0.05
    _, y = _pixels()
    assert sorted(torch.cat([s.train_y, s.test_y]).tolist()) == sorted(y.tolist())
    assert _listing(made[fmt]) == before  # read only


def test_image_folder_with_its_own_test_split(made):
    s = load_dataset("huggingface", path=str(made["imagefolder"]), format="imagefolder")
    assert s.train_x.shape == (12, 3, 8, 8) and s.test_x.shape == (6, 3, 8, 8)
    assert s.train_y.dtype == torch.int64 and int(s.train_y.max()) < s.num_classes


def test_natural_ids_and_unnormalised(made):
    s = load_dataset("huggingface", path=str(made["arrow"]), partition_by="writer_id",
                     normalize=False)
    assert s.group_names == [f"w{i}" for i in range(WRITERS)]
    assert s.train_groups.shape == (160,) and s.test_groups.shape == (40,)
    assert 0.0 <= float(s.train_x.min()) and float(s.train_x.max()) <= 1.0
    fed = build_federated_dataset(s, "natural", None, 0)
    assert fed.client_names == s.group_names and fed.client_test_indices is not None


def test_listed_by_fedforge_datasets():
    assert "huggingface" in DATASETS
    res = CliRunner().invoke(app, ["datasets"])
    assert res.exit_code == 0 and "huggingface" in res.output


# ----------------------------------------------------------------------------- partitions


@pytest.mark.parametrize("name,options", [
    ("flwr:iid", {}),
    ("flwr:dirichlet", {"alpha": 0.3, "partition_by": "label"}),
    ("flwr:pathological", {"num_classes_per_partition": 2}),
    ("dirichlet", {"alpha": 0.3, "min_size": 5}),
])
def test_partitions_cover_once_with_label_matched_tests(made, name, options):
    s = load_dataset("huggingface", path=str(made["parquet"]))
    fed = build_federated_dataset(s, name, 4, seed=3, **options)
    again = build_federated_dataset(s, name, 4, seed=3, **options)
    train = torch.cat(fed.client_indices)
    assert sorted(train.tolist()) == list(range(s.num_train))  # each sample exactly once
    assert all(torch.equal(a, b) for a, b in zip(fed.client_indices, again.client_indices))
    test = torch.cat(fed.client_test_indices)
    assert len(set(test.tolist())) == len(test) <= s.num_test
    for tr, te in zip(fed.client_indices, fed.client_test_indices):
        assert set(s.test_y[te].tolist()) <= set(s.train_y[tr].tolist())  # its own classes
    if name == "flwr:pathological":
        assert all(len(set(s.train_y[ix].tolist())) <= 2 for ix in fed.client_indices)


def test_flwr_natural_id_gives_each_writer_its_own_test(made):
    s = load_dataset("huggingface", path=str(made["arrow"]), partition_by="writer_id")
    fed = build_federated_dataset(s, "flwr:natural_id", None, 0, partition_by="writer_id")
    assert fed.client_names == [f"w{i}" for i in range(WRITERS)]
    for k, (tr, te) in enumerate(zip(fed.client_indices, fed.client_test_indices)):
        assert set(s.train_groups[tr.numpy()]) == {k} == set(s.test_groups[te.numpy()])
    assert build_federated_dataset(s, "flwr:natural_id", 2, 0).num_clients == 2


def test_label_matched_tests_follow_the_label_mix():
    rng = np.random.default_rng(0)
    train, test = np.repeat([0, 1, 2], 100), np.repeat([0, 1, 2], 30)
    parts = [np.arange(0, 100), np.arange(100, 300)]  # client 0: class 0; client 1: 1 and 2
    out = label_matched_tests(train, parts, test, rng)
    assert sorted(test[out[0]]) == [0] * 30 and sorted(test[out[1]]) == [1] * 30 + [2] * 30


# ----------------------------------------------------------------------------- end to end


def _config(tmp_path: Path, path: Path, partition: str, options: str, fmt: str = "auto") -> Path:
    cfg = tmp_path / "hf.toml"
    cfg.write_text(f"""
name = "hf"
seed = 0
rounds = 2
[data]
dataset = "huggingface"
partition = "{partition}"
num_clients = 4
options = {{ path = "{path}", format = "{fmt}" }}
partition_options = {options}
[model]
name = "mlp"
options = {{ hidden = [32] }}
[algorithm]
name = "fedavg"
local_lr = 0.05
[client]
batch_size = 16
local_steps = 3
[server]
clients_per_round = 4
[eval]
every = 1
per_client = true
""")
    return cfg


@pytest.mark.parametrize("fmt,partition,options", [
    ("arrow", "dirichlet", "{ alpha = 0.5, min_size = 5 }"),
    ("parquet", "flwr:dirichlet", '{ alpha = 0.5, partition_by = "label" }'),
    ("csv", "flwr:dirichlet", '{ alpha = 0.5, partition_by = "label" }'),
])
def test_fedforge_run_end_to_end(made, tmp_path, fmt, partition, options):
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["run", str(_config(tmp_path, made[fmt], partition, options)),
                                   "--out", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "test_accuracy" in r]
    assert len(evals) == 2 and all("client_mean_accuracy" in r for r in evals)
    assert evals[-1]["test_accuracy"] > 1 / CLASSES  # learns something in two rounds


# ----------------------------------------------------------------------------- errors


def _fails(tmp_path: Path, path: str, *overrides: str) -> str:
    cfg = _config(tmp_path, Path(path), "iid", "{}")
    res = CliRunner().invoke(app, ["run", str(cfg), "--out", str(tmp_path / "run"), "--quiet",
                                   *overrides])
    assert res.exit_code != 0
    text = res.output.strip()
    assert "Traceback" not in text and len(text.splitlines()) == 1, text
    return text


def test_a_hub_name_is_refused_not_fetched(tmp_path):
    text = _fails(tmp_path, "ylecun/mnist")
    assert "data.options.path" in text and "not a local file or folder" in text


def test_a_missing_path_names_the_field(tmp_path):
    assert "data.options.path" in _fails(tmp_path, str(tmp_path / "nowhere"))


@pytest.mark.parametrize("override,field", [
    ("data.options.label=digit", "data.options.label"),
    ("data.options.features=pixels", "data.options.features"),
    ("data.options.split=validation", "data.options.split"),
    ("data.options.format=jsonl", "data.options.format"),
    ("data.partition_options.partition_by=writer", "partition_by"),
])
def test_bad_settings_name_the_field(made, tmp_path, override, field):
    part = ["data.partition=flwr:dirichlet", "data.partition_options.alpha=0.5"] \
        if "partition_by" in override else []
    assert field in _fails(tmp_path, str(made["parquet"]), *part, override)


def test_missing_extra_names_it(made, monkeypatch):
    import sys

    from fedforge.data import huggingface

    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(DatasetError, match=r"fedforge\[huggingface\]"):
        huggingface.load_huggingface(str(made["csv"]))


# ----------------------------------------------------------------------------- the docs


def test_the_documented_example_runs(tmp_path, monkeypatch):
    """docs/huggingface.md's script, config and Python snippet run as written (2 rounds)."""
    import re

    page = (Path(__file__).resolve().parents[2] / "docs" / "huggingface.md").read_text()
    python = re.findall(r"```python\n(.*?)```", page, re.S)
    toml = re.findall(r"```toml\n(.*?)```", page, re.S)
    monkeypatch.chdir(tmp_path)
    exec(compile(python[0], "docs/huggingface.md", "exec"), {})  # noqa: S102 (our own page)
    (tmp_path / "hf_toy.toml").write_text(toml[0])
    res = CliRunner().invoke(app, ["run", "hf_toy.toml", "--out", "runs/hf_toy", "--quiet",
                                   "rounds=2"])
    assert res.exit_code == 0, res.output
    last = json.loads((tmp_path / "runs/hf_toy/metrics.jsonl").read_text().splitlines()[-1])
    assert "client_mean_accuracy" in last
    exec(compile(python[1], "docs/huggingface.md", "exec"), {})  # noqa: S102
