"""Hostile or damaged Hugging Face data: each case is one line naming the file and the
column, at load, before anything is decoded or trained. An image dataset's decoded size is
estimated from the image headers against free memory first (free memory is patched here;
no big file is made), and no file outside the dataset's folder is read."""

from __future__ import annotations

import json
import shutil
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
Image = pytest.importorskip("PIL.Image")

from fedforge.cli import app  # noqa: E402
from fedforge.core import memory  # noqa: E402
from fedforge.data import DatasetError, load_dataset  # noqa: E402

QUICK = str(Path("examples/quickstart.toml").resolve())
N = 12


def _refused(path: Path, **options) -> str:
    """The one-line error loading ``path`` gives."""
    with pytest.raises(DatasetError) as info:
        load_dataset("huggingface", path=str(path), **options)
    text = str(info.value)
    assert "\n" not in text, text
    return text


def _cli_error(*args: str) -> str:
    res = CliRunner().invoke(app, [*args, "--quiet"])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), res.output
    return lines[0]


def _parquet(path: Path, **columns) -> Path:
    pq.write_table(pa.table(columns), path)
    return path


def _labels() -> list[int]:
    return [i % 2 for i in range(N)]


def _image_folder(root: Path, size: tuple[int, int] = (16, 12)) -> Path:
    """``train/<class>/*.png``: N small RGB images."""
    rng = np.random.default_rng(0)
    for i in range(N):
        folder = root / "train" / f"c{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{i}.png")
    return root


# ----------------------------------------------------------------------------- H12: memory


def test_an_image_folder_past_free_memory_is_refused_before_decoding(tmp_path, monkeypatch):
    folder = _image_folder(tmp_path / "photos")
    decoded = N * 16 * 12 * 3  # width x height x channels, uint8
    monkeypatch.setattr(memory, "available_memory", lambda device=None: 2 * decoded)
    loads: list[object] = []
    monkeypatch.setattr(Image.Image, "load", lambda im: loads.append(im))  # nothing decoded
    cfg = tmp_path / "hf.toml"
    cfg.write_text(f'name = "hf"\n[data]\ndataset = "huggingface"\npartition = "iid"\n'
                   f'num_clients = 2\noptions = {{ path = "{folder}" }}\n[model]\n'
                   'name = "logreg"\n[algorithm]\nname = "fedavg"\n[server]\n'
                   'clients_per_round = 2\n')
    line = _cli_error("run", str(cfg), "--out", str(tmp_path / "run"))
    assert str(folder) in line and f"{N} images of column 'image'" in line, line
    assert memory.format_bytes(6 * decoded) in line and "memory is available" in line, line
    assert not loads


def test_an_image_folder_that_fits_loads(tmp_path, monkeypatch):
    folder = _image_folder(tmp_path / "photos")
    monkeypatch.setattr(memory, "available_memory", lambda device=None: 6 * N * 16 * 12 * 3)
    s = load_dataset("huggingface", path=str(folder))
    assert s.train_x.shape[1:] == (3, 12, 16) and s.num_train + s.num_test == N


# ----------------------------------------------------------------------------- labels


def test_a_nan_label_names_file_and_column(tmp_path):
    y = [float("nan")] + [float(v) for v in _labels()[1:]]
    path = _parquet(tmp_path / "d.parquet", x=np.arange(N, dtype=float), label=y)
    text = _refused(path)
    assert str(path) in text and "'label'" in text and "missing values" in text, text


def test_an_empty_csv_label_names_file_and_column(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("x,label\n" + "".join(f"{i},{'' if i == 3 else i % 2}\n" for i in range(N)))
    text = _refused(path)
    assert str(path) in text and "'label'" in text and "missing" in text, text


def test_a_label_of_2_to_the_62_is_one_line(tmp_path):
    y = pa.array([2**62] + _labels()[1:], pa.int64())
    path = _parquet(tmp_path / "d.parquet", x=np.arange(N, dtype=float), label=y)
    text = _refused(path)
    assert str(path) in text and "'label'" in text and str(2**62) in text, text


def test_a_class_label_out_of_range_is_refused_at_load(tmp_path):
    features = datasets.Features({"x": datasets.Value("float64"),
                                  "label": datasets.ClassLabel(names=["a", "b"])})
    raw = datasets.Dataset.from_dict({"x": [float(i) for i in range(N)],
                                      "label": [5] + _labels()[1:]})
    # the table as written, under a ClassLabel of two names (as a damaged file declares it)
    datasets.Dataset(raw.data, info=datasets.DatasetInfo(features=features)).save_to_disk(
        str(tmp_path / "arrow"))
    text = _refused(tmp_path / "arrow")
    assert "'label'" in text and "class id 5" in text and "2 names" in text, text


# ----------------------------------------------------------------------------- features


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_features_are_refused_at_load(tmp_path, bad):
    b = np.arange(N, dtype=float)
    b[2] = bad
    path = _parquet(tmp_path / "d.parquet", a=np.ones(N), b=b, label=_labels())
    text = _refused(path)
    assert str(path) in text and "column 'b'" in text and ("NaN" in text or "missing" in text)


# ----------------------------------------------------------------------------- images


def test_a_truncated_image_names_the_file(tmp_path):
    folder = _image_folder(tmp_path / "photos", size=(64, 48))
    victim = folder / "train" / "c1" / "3.png"
    victim.write_bytes(victim.read_bytes()[:200])
    text = _refused(folder)
    assert str(victim) in text and "truncated" in text, text


def test_a_truncated_embedded_image_names_the_file_and_row(tmp_path):
    pixels = np.zeros((8, 8), np.uint8)
    good = Image.fromarray(pixels)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    ds = datasets.Dataset.from_dict({"image": [good] * N, "label": _labels()},
                                    features=features)
    path = tmp_path / "d.parquet"
    ds.to_parquet(str(path))
    table = pq.read_table(path)
    cells = table.column("image").to_pylist()
    cells[4] = {"bytes": cells[4]["bytes"][:40], "path": None}
    pq.write_table(table.set_column(0, "image", pa.array(cells, table.schema.field(0).type)),
                   path)
    text = _refused(path, test_fraction=0.5)
    assert str(path) in text and "column 'image'" in text and "row" in text, text


def _png_header(width: int, height: int) -> bytes:
    """A tiny PNG that declares ``width`` x ``height`` grey pixels (a decompression bomb's
    header: opening it reads only this)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b""))
            + chunk(b"IEND", b""))


def test_a_decompression_bomb_is_one_line_naming_the_file(tmp_path):
    folder = _image_folder(tmp_path / "photos")
    bomb = folder / "train" / "c0" / "bomb.png"
    bomb.write_bytes(_png_header(40000, 40000))
    text = _refused(folder)
    assert str(bomb) in text and "decompression bomb" in text, text


def test_an_image_path_outside_the_dataset_is_not_read(tmp_path):
    outside = tmp_path / "elsewhere.png"
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(outside)
    (tmp_path / "ds").mkdir()
    path = tmp_path / "ds" / "d.parquet"
    kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    cells = pa.array([{"bytes": None, "path": str(outside)}] * N, kind)
    meta = {"huggingface": json.dumps({"info": {"features": {
        "image": {"_type": "Image"}, "label": {"dtype": "int64", "_type": "Value"}}}})}
    pq.write_table(pa.table({"image": cells, "label": _labels()}).replace_schema_metadata(meta),
                   path)
    text = _refused(path)
    assert str(outside) in text and "outside the dataset folder" in text, text


# ----------------------------------------------------------------------------- state.json


@pytest.fixture
def saved(tmp_path) -> tuple[Path, Path]:
    """(a save_to_disk folder, an Arrow file outside it that holds other rows)."""
    folder = tmp_path / "ds"
    datasets.Dataset.from_dict({"x": [0.5] * N, "label": _labels()}).save_to_disk(str(folder))
    other = tmp_path / "secret"
    datasets.Dataset.from_dict({"x": [9.0] * N, "label": _labels()}).save_to_disk(str(other))
    return folder, next(other.glob("*.arrow"))


def _point_state_at(folder: Path, filename: str) -> None:
    state = json.loads((folder / "state.json").read_text())
    state["_data_files"] = [{"filename": filename}]
    (folder / "state.json").write_text(json.dumps(state))


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_a_state_json_pointing_outside_the_folder_is_refused(saved, how):
    folder, secret = saved
    if how == "dotdot":
        _point_state_at(folder, f"../secret/{secret.name}")
    elif how == "absolute":
        _point_state_at(folder, str(secret))
    else:
        mine = next(folder.glob("*.arrow"))
        mine.unlink()
        mine.symlink_to(secret)
    text = _refused(folder)
    assert "state.json" in text and "outside the dataset folder" in text, text


def test_a_dataset_dict_split_outside_the_folder_is_refused(saved, tmp_path):
    folder, _ = saved
    root = tmp_path / "dict"
    shutil.copytree(folder, root / "train")
    (root / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "../secret"]}))
    text = _refused(root)
    assert "dataset_dict.json" in text and "outside the dataset folder" in text, text


def test_a_state_json_inside_the_folder_still_loads(saved):
    folder, _ = saved
    (folder / "sub").mkdir()
    _point_state_at(folder, f"./sub/../{next(folder.glob('*.arrow')).name}")
    s = load_dataset("huggingface", path=str(folder))
    assert s.num_train + s.num_test == N and float(s.train_x.std()) < 1e-6  # its own rows


# ----------------------------------------------------------------------------- out of memory


def test_a_thread_that_cannot_start_while_loading_says_memory(saved, monkeypatch):
    folder, _ = saved

    def no_thread(*args, **kwargs):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(datasets, "load_from_disk", no_thread)
    text = _refused(folder)
    assert str(folder) in text and "out of memory" in text, text


def test_memory_error_inside_the_library_says_memory(tmp_path, monkeypatch):
    folder = _image_folder(tmp_path / "photos")

    def generation_failed(*args, **kwargs):
        try:
            raise MemoryError
        except MemoryError as exc:
            raise RuntimeError("An error occurred while generating the dataset") from exc

    monkeypatch.setattr(datasets, "load_dataset", generation_failed)
    assert "out of memory" in _refused(folder)


ALLOC_FAILED = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't "
                "allocate memory: you tried to allocate 3600000000 bytes. Error code 12 "
                "(Cannot allocate memory)")


@pytest.mark.parametrize("where,error", [
    ("build_model", MemoryError()),
    ("initial_params", RuntimeError(ALLOC_FAILED)),
])
def test_a_model_that_fits_mem_available_but_not_the_process_is_one_line(
        tmp_path, monkeypatch, where, error):
    """Under ``ulimit -v`` the model's allocation fails although MemAvailable said it fits."""
    from fedforge.experiment import build

    def fail(*args, **kwargs):
        raise error

    if where == "build_model":
        monkeypatch.setattr(build, "build_model", fail)
    else:
        owner = next(v for v in vars(build).values()
                     if isinstance(v, type) and "initial_params" in vars(v))
        monkeypatch.setattr(owner, "initial_params", fail)
    line = _cli_error("run", QUICK, "rounds=1", "--out", str(tmp_path / "run"))
    assert "out of memory" in line and "ulimit -v" in line, line
    if where == "initial_params":
        assert "3600000000 bytes" in line and "enforce fail" not in line, line


def test_a_runtime_error_that_is_not_memory_is_not_hidden(tmp_path, monkeypatch):
    from fedforge.experiment import build

    def fail(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(build, "build_model", fail)
    res = CliRunner().invoke(app, ["run", QUICK, "rounds=1", "--out", str(tmp_path / "r"), "-q"])
    assert isinstance(res.exception, RuntimeError) and str(res.exception) == "a bug"
