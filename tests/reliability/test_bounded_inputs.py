"""Inputs are bounded before they are read: decompressed sizes come from the file's header,
and sizes from a config (clients, batch size, model width) are checked against free memory
before anything is allocated. Each refusal is one line naming the file or the field."""

from __future__ import annotations

import gzip
import io
import lzma
import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import fedforge.core.memory as memory
from fedforge.cli import app
from fedforge.core.memory import AllocationError, available_memory, check_allocation
from fedforge.data import DatasetError, load_dataset
from fedforge.data.base import read_gzip, read_npy_xz
from fedforge.data.batching import client_batches
from fedforge.data.images import read_idx
from fedforge.models import MLP, build_model

BOMB = 50 << 20  # 50 MB of zeros: about 50 KB gzipped
EXAMPLE = Path(__file__).parents[2] / "examples" / "quickstart.toml"


def _peak_bytes(fn) -> int:
    """Peak Python-heap bytes while ``fn`` runs (decompressed buffers are Python bytes)."""
    tracemalloc.start()
    try:
        fn()
    except (DatasetError, AllocationError):
        pass
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


def _idx_bomb(path: Path, header: bytes) -> Path:
    path.write_bytes(gzip.compress(header + bytes(BOMB), 1))
    return path


def test_idx_gzip_bomb_is_refused_without_decompressing_it(tmp_path):
    """The header declares 10 labels; the stream holds 50 MB more. Refused after one byte."""
    path = _idx_bomb(tmp_path / "train-labels-idx1-ubyte.gz", struct.pack(">II", 2049, 10))
    with pytest.raises(DatasetError) as info:
        read_idx(path, (None,))
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg and "more than the 18 bytes" in msg
    assert _peak_bytes(lambda: read_idx(path, (None,))) < 4 << 20


def test_idx_image_bomb_in_a_dataset_folder_names_the_file(tmp_path):
    d = tmp_path / "mnist"
    d.mkdir()
    images = struct.pack(">IIII", 2051, 2, 28, 28) + bytes(2 * 784)
    labels = struct.pack(">II", 2049, 2) + bytes(2)
    for split in ("train", "t10k"):
        (d / f"{split}-images-idx3-ubyte.gz").write_bytes(gzip.compress(images))
        (d / f"{split}-labels-idx1-ubyte.gz").write_bytes(gzip.compress(labels))
    bomb = _idx_bomb(d / "train-images-idx3-ubyte.gz", images)
    with pytest.raises(DatasetError, match=f"{bomb}: decompresses to more than the 1584 bytes"):
        load_dataset("mnist", tmp_path)


def test_idx_header_declaring_more_than_memory_is_refused_before_reading(tmp_path):
    """A header may declare 4 billion images; the size is checked before the payload."""
    path = tmp_path / "images.gz"
    path.write_bytes(gzip.compress(struct.pack(">IIII", 2051, 2**32 - 1, 28, 28) + bytes(10)))
    with pytest.raises(DatasetError, match=f"{path}: IDX values of shape 4294967295x28x28 "
                                           r"\(from its header\) need .* TiB"):
        read_idx(path, (None, 28, 28))


def test_npy_xz_bomb_is_refused_without_decompressing_it(tmp_path):
    buf = io.BytesIO()
    np.save(buf, np.zeros((2, 3, 32, 32), np.uint8))
    path = tmp_path / "train_images.npy.xz"
    path.write_bytes(lzma.compress(buf.getvalue() + bytes(BOMB), preset=0))
    with pytest.raises(DatasetError, match=f"{path}: decompresses to more than the 6144 bytes"):
        read_npy_xz(path, "a uint8 array")
    assert _peak_bytes(lambda: read_npy_xz(path, "a uint8 array")) < 4 << 20


def test_npy_xz_still_round_trips(tmp_path):
    arr = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    for order in ("C", "F"):
        buf = io.BytesIO()
        np.save(buf, np.asarray(arr, order=order))
        path = tmp_path / f"a{order}.npy.xz"
        path.write_bytes(lzma.compress(buf.getvalue()))
        assert np.array_equal(read_npy_xz(path, "an array"), arr)


def test_gzipped_text_is_read_in_bounded_chunks(tmp_path, monkeypatch):
    path = tmp_path / "train.tsv.gz"
    path.write_bytes(gzip.compress(bytes(BOMB), 1))
    with pytest.raises(DatasetError, match=f"{path}: decompresses to more than 1048576 bytes"):
        read_gzip(path, "text", limit=1 << 20)
    assert _peak_bytes(lambda: read_gzip(path, "text", limit=1 << 20)) < 8 << 20


# ----------------------------------------------------------------------------- allocations


@pytest.fixture
def one_gib(monkeypatch):
    """Pretend 1 GiB of memory is free, whatever the machine has."""
    monkeypatch.setattr(memory, "available_memory", lambda device=None: 1 << 30)


def test_check_allocation_names_the_field_and_the_size(one_gib):
    check_allocation(1 << 29, "small")
    with pytest.raises(AllocationError, match=r"^f: 8 GiB need 8\.00 GiB; only 1\.00 GiB of "
                                              r"memory is available$"):
        check_allocation(8 << 30, "f: 8 GiB")


def test_available_memory_is_known_on_this_machine_and_falls_back(monkeypatch):
    free = available_memory()
    assert free is None or free > 0
    monkeypatch.setattr(memory, "_meminfo_available", lambda: None)
    monkeypatch.setattr(memory, "_cgroup_available", lambda: None)
    monkeypatch.setattr(memory, "_physical", lambda: None)
    assert available_memory() is None
    check_allocation(1 << 60, "unknowable")  # nothing to compare with: not refused


def test_a_billion_synthetic_clients_are_refused_before_any_draw(one_gib):
    with pytest.raises(AllocationError, match=r"^data\.options\.num_clients: 1000000000 "
                                              r"synthetic clients of dim 60 need .* TiB"):
        load_dataset("synthetic", num_clients=1_000_000_000)
    load_dataset("synthetic", num_clients=30)  # the quickstart still fits


def test_a_billion_batch_size_is_refused_before_the_schedule(one_gib):
    sizes = torch.tensor([100, 50])
    gen = torch.Generator().manual_seed(0)
    for kw in ({"steps": 2, "epochs": None}, {"steps": None, "epochs": 1}):
        with pytest.raises(AllocationError, match=r"^client\.batch_size: batches of 1000000000 "
                                                  r"for 2 clients x \d steps need"):
            client_batches(sizes, batch_size=1_000_000_000, generator=gen, **kw)
    client_batches(sizes, 2, None, 10, gen)


def test_a_huge_model_is_refused_before_its_weights_exist(one_gib):
    with pytest.raises(AllocationError, match=r"^model\.options: 'mlp' with \{'hidden': "
                                              r"\[1000000000\]\}: 795000000010 parameters need"):
        build_model("mlp", (1, 28, 28), 10, hidden=[1_000_000_000])
    torch.manual_seed(0)
    a = build_model("mlp", (1, 28, 28), 10)
    torch.manual_seed(0)
    b = MLP((1, 28, 28), 10)  # the meta-device count before the build drew no random numbers
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


@pytest.mark.parametrize("override", [
    "data.options.num_clients=1000000000",
    "client.batch_size=1000000000000",
    "model.name=mlp", ])
def test_cli_says_in_one_line_what_each_size_would_need(tmp_path, override):
    extra = ["model.options.hidden=[100000000000]"] if override == "model.name=mlp" else []
    result = CliRunner().invoke(app, ["run", str(EXAMPLE), override, *extra, "--out",
                                      str(tmp_path / "r"), "-q"])
    assert result.exit_code != 0
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "need" in lines[0] and "available" in lines[0], result.output


# ----------------------------------------------------------------------------- init files


def _logreg_params():
    torch.manual_seed(0)
    return dict(build_model("logreg", (60,), 10).named_parameters())


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.float64, torch.bfloat16])
def test_init_file_of_another_dtype_is_refused_naming_file_key_and_dtypes(tmp_path, dtype):
    """A bool file used to give all-ones weights; float64 and bf16 were cast silently."""
    from safetensors.torch import save_file

    from fedforge.models.init_from import InitFromError, load_init

    params = _logreg_params()
    path = tmp_path / "w.safetensors"
    save_file({k: torch.ones_like(v, dtype=dtype) for k, v in params.items()}, str(path))
    with pytest.raises(InitFromError) as info:
        load_init(params, path)
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg and "'linear.weight'" in msg
    assert f"dtype {dtype}, the model's parameters are torch.float32" in msg


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_init_weights_are_refused_before_a_run_blames_the_clients(tmp_path, bad):
    from safetensors.torch import save_file

    params = _logreg_params()
    weights = {k: v.detach().clone() for k, v in params.items()}
    weights["linear.weight"][0, 1] = bad
    path = tmp_path / "w.safetensors"
    save_file(weights, str(path))
    result = CliRunner().invoke(app, [
        "run", str(EXAMPLE), f"model.init_from={path}", "divergence=rollback", "rounds=2",
        "--out", str(tmp_path / "r"), "-q"])
    assert result.exit_code == 2
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1, result.output
    assert str(path) in lines[0] and "'linear.weight' holds 1 NaN or Inf values" in lines[0]
    assert not (tmp_path / "r" / "checkpoints").exists()  # no round ran, nothing rolled back
