"""A resumed run continues the run that was started: the keys that select which samples train
or are evaluated (listed from the config schema) may not change, a checkpoint resumes only
under the algorithm that wrote it, and the zoo MLP's head is its real last layer whatever
its hidden layers."""

from __future__ import annotations

import json
import shutil
import typing
from pathlib import Path

import pytest
import tomli_w
from typer.testing import CliRunner

from fedforge.cli import app
from fedforge.experiment.config import RUN_KINDS, load_config
from fedforge.experiment.rundir import (
    MULTITASK_MAY_CHANGE,
    RUN_MAY_CHANGE,
    RunDirError,
    claim_run_dir,
)

QUICK = str(Path(__file__).parents[2] / "examples" / "quickstart.toml")
FAST = ["checkpoint.every=1", "eval.every=1", "data.options.num_clients=6",
        "data.options.max_samples_per_client=20", "server.clients_per_round=3"]


def _cli(*args: str):
    return CliRunner().invoke(app, ["run", QUICK, *FAST, *args, "-q"])


def _one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


# ------------------------------------------------- keys that select data (P7)

def _field(schema, key: str):
    """The pydantic field of dotted ``key`` (``*``: a list's items) in ``schema``."""
    parts = key.split(".")
    for part in parts[:-1]:
        if part == "*":
            continue
        inner = schema.model_fields[part].annotation
        schema = typing.get_args(inner)[0] if typing.get_origin(inner) is list else inner
    return schema.model_fields[parts[-1]]


def _other_value(field, value):
    """A valid value of ``field`` other than ``value``."""
    kinds = typing.get_args(field.annotation) or (field.annotation,)
    if bool in kinds:
        return value is not True
    if int in kinds:
        return (value or 0) + 1
    return value / 2 if value else 0.5  # a share in [0, 1) (0.0 / 2 would not differ)


def _set(tree: dict, key: str, value) -> None:
    *parents, last = key.replace("*", "0").split(".")
    for part in parents:
        tree = tree[int(part)] if isinstance(tree, list) else tree.setdefault(part, {})
    tree[last] = value


@pytest.mark.parametrize("kind", sorted(RUN_KINDS))
def test_every_key_the_schema_marks_as_selecting_data_is_refused_on_resume(tmp_path, kind):
    from fedforge.experiment.config import data_selecting_keys  # noqa: PLC0415

    schema = RUN_KINDS[kind]
    keys = data_selecting_keys(schema)
    if kind == "single":  # the cases are among them
        assert {"eval.personal", "eval.held_out", "data.client_test_fraction"} <= set(keys)
    may_change = MULTITASK_MAY_CHANGE if schema.multitask else RUN_MAY_CHANGE
    base = schema.model_validate({"tasks": [{}]} if schema.multitask else {})
    saved = base.model_dump(by_alias=True, exclude_none=True)
    assert keys
    for key in keys:
        out = tmp_path / key
        out.mkdir()
        (out / "config.resolved.toml").write_text(tomli_w.dumps(saved))
        (out / "metrics.jsonl").write_text('{"round": 1}\n')
        new = json.loads(json.dumps(saved))
        current = base
        for part in key.replace("*", "0").split("."):
            current = current[int(part)] if isinstance(current, list) else getattr(
                current, part)
        _set(new, key, _other_value(_field(schema, key), current))
        with pytest.raises(RunDirError) as info:
            with claim_run_dir(out, lambda p, new=new: p.write_text(tomli_w.dumps(new)),
                               resume=True, may_change=may_change):
                pass
        shown = key.replace("*", "0")
        assert f"a different config: {shown} differ" in str(info.value), key
        assert f"{shown} selects which samples train or are evaluated" in str(info.value)
        assert "\n" not in str(info.value)
        assert tomli_w.dumps(saved) == (out / "config.resolved.toml").read_text()


def test_eval_settings_that_select_no_data_may_still_change(tmp_path):
    saved = RUN_KINDS["single"]().model_dump(by_alias=True, exclude_none=True)
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.resolved.toml").write_text(tomli_w.dumps(saved))
    (out / "metrics.jsonl").write_text('{"round": 1}\n')
    new = json.loads(json.dumps(saved))
    new["rounds"] += 5
    new["eval"].update(every=3, batch_size=64, per_client=False, finetune_steps=2)
    with claim_run_dir(out, lambda p: p.write_text(tomli_w.dumps(new)), resume=True):
        pass


def test_personal_evaluation_switched_on_at_resume_is_refused(tmp_path):
    """Case P7: ``eval.personal`` holds out a share of each client's training data."""
    out = tmp_path / "run"
    assert _cli("eval.personal=false", "rounds=1", "--out", str(out)).exit_code == 0
    kept = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    line = _one_line_error(_cli("eval.personal=true", "rounds=2", "--resume", "--out", str(out)))
    assert "cannot resume with a different config: eval.personal differ" in line
    assert "eval.personal selects which samples train or are evaluated" in line
    assert {p: (out / p).read_bytes() for p in kept if p != "run.lock"} == {
        p: b for p, b in kept.items() if p != "run.lock"}


# ----------------------------------------------- a checkpoint names its algorithm

@pytest.fixture(scope="module")
def fedper_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "fedper"
    result = _cli("algorithm.name=fedper", "rounds=1", "--out", str(out))
    assert result.exit_code == 0, result.output
    (out / "run.lock").unlink(missing_ok=True)
    return out


def test_a_checkpoint_records_the_algorithm_that_wrote_it(fedper_run):
    meta = json.loads((fedper_run / "checkpoints" / "round_00001.json").read_text())
    assert meta["algorithm"] == "fedper"
    assert any(k.startswith("clients/") for k in meta["keys"])  # a personal state


def test_another_methods_personal_checkpoint_is_refused(fedper_run, tmp_path):
    """FedPer's and FedRep's client states have the same leaves: only the record tells."""
    out = tmp_path / "fedrep"
    assert _cli("algorithm.name=fedrep", "rounds=1", "--out", str(out)).exit_code == 0
    shutil.rmtree(out / "checkpoints")
    shutil.copytree(fedper_run / "checkpoints", out / "checkpoints")
    line = _one_line_error(_cli("algorithm.name=fedrep", "rounds=2", "--resume", "--out",
                                str(out)))
    assert line == (f"error: {out / 'checkpoints' / 'round_00001.json'}: a checkpoint of "
                    "algorithm 'fedper', not of this run's 'fedrep'; choose another --out or "
                    "pass --overwrite")


def test_a_checkpoint_from_before_the_record_resumes_as_before(fedper_run, tmp_path):
    out = Path(shutil.copytree(fedper_run, tmp_path / "old"))
    path = out / "checkpoints" / "round_00001.json"
    meta = json.loads(path.read_text())
    meta.pop("algorithm", None)
    path.write_text(json.dumps(meta))
    result = _cli("algorithm.name=fedper", "rounds=2", "--resume", "--out", str(out))
    assert result.exit_code == 0, result.output


# ------------------------------------------------------- the zoo MLP's default head

@pytest.mark.parametrize("hidden", [[], [16], [16, 8], [16, 8, 4]])
def test_the_mlp_head_defaults_to_its_last_layer(hidden):
    from fedforge.algorithms import build_algorithm  # noqa: PLC0415
    from fedforge.algorithms.personal.split import head_names  # noqa: PLC0415
    from fedforge.experiment.config import algorithm_kwargs  # noqa: PLC0415
    from fedforge.models import build_model  # noqa: PLC0415

    cfg = load_config(QUICK, ["model.name=mlp", f"model.options={{hidden: {hidden}}}",
                              "algorithm.name=fedrep"])
    names = [n for n, _ in build_model("mlp", (60,), 10, hidden=hidden).named_parameters()]
    head = build_algorithm("fedrep", **algorithm_kwargs(cfg)).personal.head
    last = f"net.{2 * len(hidden)}"
    assert head_names(names, head) == (f"{last}.weight", f"{last}.bias")


def test_a_one_hidden_layer_mlp_runs_fedper_with_its_last_layer_as_head(tmp_path):
    out = tmp_path / "mlp"
    result = _cli("model.name=mlp", "model.options={hidden: [16]}", "algorithm.name=fedper",
                  "rounds=1", "--out", str(out))
    assert result.exit_code == 0, result.output
    meta = json.loads((out / "checkpoints" / "round_00001.json").read_text())
    assert [k for k in meta["keys"] if k.startswith("clients/")] == [
        "clients/personal/net.2.weight", "clients/personal/net.2.bias"]
