"""The disk client store's files as untrusted input: a resumed run refuses corrupt, truncated,
reshaped and planted files in one line naming the file, and writes nothing outside the run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fedforge.core.checkpoint import CheckpointError, file_sha256
from fedforge.experiment.config import load_config
from fedforge.experiment.runner import run_experiment

ROOT = Path(__file__).resolve().parents[2]
OVERRIDES = ["rounds=2", "eval.every=2", "checkpoint.every=1", "data.options.num_clients=8",
             "server.clients_per_round=3", "client.batch_size=5", "client.local_epochs=null",
             "client.local_steps=2", "eval.per_client=false", "engine.name=vmap",
             "algorithm.name=scaffold", "engine.client_store=disk"]


def _cfg(*extra: str):
    return load_config(ROOT / "examples/quickstart.toml", [*OVERRIDES, *extra])


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("store") / "run"
    run_experiment(_cfg(), run, progress=False)
    return run


@pytest.fixture
def run(finished, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(finished, copy, symlinks=True)
    return copy


@pytest.fixture
def outside(tmp_path) -> Path:
    """A folder beside the run that nothing may write, change or delete."""
    path = tmp_path / "outside"
    path.mkdir()
    (path / "precious.rows").write_bytes(b"keep me")
    return path


def _snapshot(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _segments(run: Path) -> list[Path]:
    meta = json.loads((run / "checkpoints" / "round_00002.json").read_text())
    return [run / "clients" / s["file"] for s in meta["store"]["ranks"][0]]


def _refused(run: Path, match: str) -> str:
    with pytest.raises(CheckpointError) as err:
        run_experiment(_cfg("rounds=3"), run, resume=True, progress=False)
    msg = str(err.value)
    assert "\n" not in msg and "Traceback" not in msg
    assert msg.startswith(str(run)), msg  # names the file first
    assert match in msg, msg
    return msg


def test_the_checkpoint_names_its_store_version_and_segments(finished):
    meta = json.loads((finished / "checkpoints" / "round_00002.json").read_text())
    store = meta["store"]
    assert (store["kind"], store["version"], store["world"]) == ("disk", 2, 1)
    for seg, path in zip(store["ranks"][0], _segments(finished), strict=True):
        assert file_sha256(path) == seg["sha256"]
    assert not any(k.startswith("clients") for k in meta["keys"])  # rows are not tensors here


def test_a_flipped_byte_is_refused(run):
    path = _segments(run)[-1]
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    _refused(run, f"{path.name}: SHA-256")


def test_a_truncated_segment_is_refused(run):
    path = _segments(run)[-1]
    path.write_bytes(path.read_bytes()[:-9])
    _refused(run, f"{path.name}: SHA-256")


def test_a_missing_segment_is_refused(run):
    path = _segments(run)[0]
    path.unlink()
    _refused(run, f"{path.name}: ")


def test_a_segment_of_other_tensors_is_refused_even_with_its_hash(run):
    from safetensors.torch import load_file, save_file

    path = _segments(run)[-1]
    tensors = load_file(str(path))
    tensors["planted"] = tensors["ids"].clone()
    save_file(tensors, str(path))
    meta_path = run / "checkpoints" / "round_00002.json"
    meta = json.loads(meta_path.read_text())
    for seg in meta["store"]["ranks"][0]:
        if seg["file"] == path.name:
            seg["sha256"] = file_sha256(path)
    meta_path.write_text(json.dumps(meta))
    _refused(run, "holds tensors ['planted']")


@pytest.mark.parametrize("name", ["segment_00001_00002.safetensors", "live_00000.rows",
                                  "notes.txt"])
def test_a_planted_link_in_the_store_is_refused(run, outside, name):
    before = _snapshot(outside)
    target = run / "clients" / name
    target.unlink(missing_ok=True)
    target.symlink_to(outside / "precious.rows")
    _refused(run, f"clients/{name}: is a symbolic link")
    assert _snapshot(outside) == before


def test_a_planted_extra_file_is_refused(run):
    (run / "clients" / "extra.bin").write_bytes(b"x")
    _refused(run, "extra.bin: is not a file the client store writes")


def test_a_store_folder_that_is_a_link_is_refused(run, outside):
    before = _snapshot(outside)
    shutil.rmtree(run / "clients")
    (run / "clients").symlink_to(outside, target_is_directory=True)
    _refused(run, "clients: is a symbolic link")
    assert _snapshot(outside) == before


def test_a_segment_name_leading_elsewhere_is_refused(run, outside):
    meta_path = run / "checkpoints" / "round_00002.json"
    meta = json.loads(meta_path.read_text())
    meta["store"]["ranks"][0][0]["file"] = "../../outside/precious.rows"
    meta_path.write_text(json.dumps(meta))
    before = _snapshot(outside)
    _refused(run, "store segment names must be plain file names")
    assert _snapshot(outside) == before


def test_a_fresh_run_with_overwrite_removes_the_old_rows(run):
    old = set(p.name for p in (run / "clients").iterdir())
    run_experiment(_cfg("rounds=1"), run, overwrite=True, progress=False)
    meta = json.loads((run / "checkpoints" / "round_00001.json").read_text())
    now = {s["file"] for s in meta["store"]["ranks"][0]}
    assert {p.name for p in (run / "clients").glob("segment_*")} == now
    assert now == {"segment_00001_00001.safetensors"} and old != now
