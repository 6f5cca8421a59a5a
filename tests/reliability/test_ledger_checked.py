"""The privacy ledger of a received run folder is checked, not trusted: a resume refuses a
checkpoint whose spans do not match the config (mode, rate, steps, a fixed σ) or the σ that
metrics.jsonl recorded for their rounds, and one that would lower the reported ε. Before
these checks, each edit below resumed with exit code 0 and rounds 4-6 ran at the forged σ
(ε fell from 3.999 to 0.279 after σ 1.18 -> 9.41)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("dp_accounting", reason="needs the privacy extra (dp-accounting)")

from fedforge import cli  # noqa: E402
from fedforge.core.checkpoint import latest_checkpoint_meta  # noqa: E402
from fedforge.experiment.config import load_config  # noqa: E402
from fedforge.experiment.runner import run_experiment  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples/privacy_mnist.toml"
# as tests/reliability/test_privacy_ledger.py: 30 synthetic clients, q = 10/30, target ε = 4
SYNTH = ["data.dataset=synthetic", "data.partition=natural", "data.options.num_clients=30",
         "data.num_clients=30", "server.clients_per_round=10", "model.name=logreg",
         "eval.every=1", "checkpoint.every=1"]
FIXED = ["privacy.noise_multiplier=1.0", "privacy.target_epsilon=null"]


def _cfg(*overrides: str):
    return load_config(CONFIG, [*SYNTH, *overrides])


def _ran(tmp_path_factory, *overrides: str) -> Path:
    run = tmp_path_factory.mktemp("ledger") / "run"
    run_experiment(_cfg(*overrides), run, progress=False)
    return run


@pytest.fixture(scope="module")
def three_rounds(tmp_path_factory) -> Path:
    """Three rounds calibrated for ε = 4 (σ 1.18), a checkpoint after each; copy it first."""
    return _ran(tmp_path_factory, "rounds=3")


@pytest.fixture(scope="module")
def fixed_sigma(tmp_path_factory) -> Path:
    """Three rounds at the config's σ = 1.0 (no target)."""
    return _ran(tmp_path_factory, *FIXED, "rounds=3")


def _edit_checkpoint(run: Path, edit) -> Path:
    path, meta = latest_checkpoint_meta(run / "checkpoints")
    edit(meta["privacy"]["ledger"])
    path.write_text(json.dumps(meta))
    return path


def _edit_metrics(run: Path, **values) -> None:
    path = run / "metrics.jsonl"
    records = [json.loads(x) for x in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({**r, **values}) + "\n" for r in records))


def _split(ledger: list) -> None:
    """Rounds 1-3 become 1-1 at σ and 2-3 at 10 σ."""
    first = ledger[0]
    ledger[:] = [{**first, "last": 1}, {**first, "first": 2, "sigma": 10 * first["sigma"]}]


CASES = {  # edit of the checkpoint's ledger, the field the refusal names, the reason
    "sigma_flipped": (lambda led: led[0].update(sigma=9.41), r"privacy.ledger\[0\].sigma",
                      r"is 9.41, but \S+metrics.jsonl records dp_noise_multiplier [0-9.]+ "
                      r"for round 1"),
    "rate_lowered": (lambda led: led[0].update(rate=0.01), r"privacy.ledger\[0\].rate",
                     r"is 0.01, but this run's config gives 0.333"),
    "span_split_at_ten_times_sigma": (_split, r"privacy.ledger\[1\].sigma",
                                      r"is [0-9.]+, but \S+metrics.jsonl records "
                                      r"dp_noise_multiplier [0-9.]+ for round 2"),
    "mode_changed": (lambda led: led[0].update(mode="sample", rate=1.0, sigma=50.0),
                     r"privacy.ledger\[0\].mode", r"is 'sample', but this run's config gives "
                                                   r"'central'"),
    "steps_changed": (lambda led: led[0].update(steps=2), r"privacy.ledger\[0\].steps",
                      r"is 2, but this run's config gives 1"),
}


def _refused(run: Path, path: Path, field: str, why: str, *overrides: str) -> None:
    """The resume is refused in one line naming the checkpoint file and the field, and
    leaves the folder's results as they were."""
    before = {p: p.read_bytes() for p in [run / "metrics.jsonl",
                                           *sorted((run / "checkpoints").iterdir())]}
    where = re.escape(str(path))
    with pytest.raises(ValueError, match=rf"^{where}: checkpoint field '{field}'") as err:
        run_experiment(_cfg(*overrides), run, resume=True, progress=False)
    assert re.search(why, str(err.value)), str(err.value)
    assert "\n" not in str(err.value)
    assert {p: p.read_bytes() for p in before} == before


@pytest.mark.parametrize("case", list(CASES))
def test_an_edited_ledger_span_is_refused_naming_the_file_and_field(three_rounds, tmp_path,
                                                                    case):
    edit, field, why = CASES[case]
    run = tmp_path / "run"
    shutil.copytree(three_rounds, run)
    path = _edit_checkpoint(run, edit)
    _refused(run, path, field, why, "rounds=6")


def test_a_forged_sigma_with_forged_records_is_refused_for_lowering_epsilon(three_rounds,
                                                                           tmp_path):
    """σ edited in the ledger and in every record, but not the ε each record reported:
    rounds 1-3 would be charged 0.279 instead of the 3.999 already reported."""
    run = tmp_path / "run"
    shutil.copytree(three_rounds, run)
    path = _edit_checkpoint(run, lambda led: led[0].update(sigma=9.41))
    _edit_metrics(run, dp_noise_multiplier=9.41)
    _refused(run, path, "privacy.ledger",
             r"gives ε = 0.2[0-9]+ after round 3, below the ε = 3.99[0-9]+ that \S+metrics.jsonl "
             r"recorded; a resume never lowers the reported ε", "rounds=6")


def test_a_span_off_the_fixed_sigma_is_refused_even_with_matching_records(fixed_sigma,
                                                                         tmp_path):
    run = tmp_path / "run"
    shutil.copytree(fixed_sigma, run)
    path = _edit_checkpoint(run, lambda led: led[0].update(sigma=9.0))
    _edit_metrics(run, dp_noise_multiplier=9.0)
    _refused(run, path, r"privacy.ledger\[0\].sigma", r"is 9.0, but this run's config gives "
                                                      r"1.0", *FIXED, "rounds=6")


def test_the_command_refuses_the_forged_sigma_in_one_line(three_rounds, tmp_path):
    """The reported case from the command line: exit code 2, not 0."""
    run = tmp_path / "run"
    shutil.copytree(three_rounds, run)
    (run / "run.lock").unlink(missing_ok=True)
    path = _edit_checkpoint(run, lambda led: led[0].update(sigma=9.41))
    result = CliRunner().invoke(cli.app, ["run", str(CONFIG), *SYNTH, "rounds=6", "-q",
                                          "--resume", "--out", str(run)])
    assert result.exit_code == 2, result.output
    line = f"error: {path}: checkpoint field 'privacy.ledger[0].sigma' is 9.41"
    assert line in " ".join(result.output.split()), result.output
    assert len([x for x in result.output.splitlines() if x.startswith("error:")]) == 1
