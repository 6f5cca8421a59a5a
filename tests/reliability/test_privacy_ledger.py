"""The privacy ledger: ε composes the mechanism each round actually ran with, also across a
resume that changes σ; resumes that would exceed the budget, malformed ledgers and budgets
that admit no round are refused in one line; settings whose guarantee means little warn."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

pytest.importorskip("dp_accounting", reason="needs the privacy extra (dp-accounting)")

import dp_accounting  # noqa: E402
from dp_accounting.rdp import rdp_privacy_accountant  # noqa: E402

from fedforge.core.checkpoint import latest_checkpoint_meta  # noqa: E402
from fedforge.experiment.config import ConfigError, load_config  # noqa: E402
from fedforge.experiment.runner import run_experiment  # noqa: E402
from fedforge.privacy.algorithm import resolve  # noqa: E402
from fedforge.privacy.checks import PrivacyWarning  # noqa: E402
from fedforge.privacy.ledger import Span, from_meta  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# examples/privacy_mnist.toml on synthetic data: 30 clients, q = 10/30, δ = 1e-5, RDP
SYNTH = ["data.dataset=synthetic", "data.partition=natural", "data.options.num_clients=30",
         "data.num_clients=30", "server.clients_per_round=10", "model.name=logreg",
         "eval.every=1", "checkpoint.every=1"]
Q, DELTA = 1 / 3, 1e-5


def _cfg(*overrides: str):
    return load_config(ROOT / "examples/privacy_mnist.toml", [*SYNTH, *overrides])


def _records(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def _reference_epsilon(sigmas: list[float], q: float = Q) -> float:
    """ε(δ) from dp_accounting, one Poisson-subsampled Gaussian event per round."""
    acc = rdp_privacy_accountant.RdpAccountant()
    for s in sigmas:
        acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(s)))
    return float(acc.get_epsilon(DELTA))


def _checkpoint(run: Path) -> tuple[Path, dict]:
    return latest_checkpoint_meta(run / "checkpoints")


def test_sigma_changing_mid_run_reports_the_composition_of_the_mechanisms():
    cfg = _cfg("privacy.noise_multiplier=1.4", "privacy.target_epsilon=null")
    mech = resolve(cfg.privacy, 6, 10, 30, 1)
    spent = (Span(1, 2, "central", 0.9, Q, 1), Span(3, 3, "central", 2.5, Q, 1))
    resumed = mech.continued(spent, 6, "ckpt.json")
    sigmas = [0.9, 0.9, 2.5, 1.4, 1.4, 1.4]
    for t in range(1, 7):
        assert resumed.epsilon(t) == pytest.approx(_reference_epsilon(sigmas[:t]), abs=1e-6)
    assert resumed.ledger(6)[-1] == Span(4, 6, "central", 1.4, Q, 1)


def test_resume_with_more_rounds_never_lowers_epsilon(tmp_path):
    """The reported case: 3 rounds calibrated for ε = 4, then --resume rounds=6. Before the
    ledger, ε fell from 3.999 to 3.399 and ended at 4.000 for a true ε of 4.70."""
    run = tmp_path / "run"
    run_experiment(_cfg("rounds=3"), run, progress=False)
    before = _records(run)[-1]["dp_epsilon"]
    run_experiment(_cfg("rounds=6"), run, resume=True, progress=False)
    records = _records(run)
    eps = [r["dp_epsilon"] for r in records]
    sigmas = [r["dp_noise_multiplier"] for r in records]
    assert [r["round"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert sigmas[3] > sigmas[2]  # σ was re-calibrated for the rest of the budget
    assert all(b >= a for a, b in zip(eps, eps[1:], strict=False)) and eps[3] >= before
    for t in range(1, 7):
        assert eps[t - 1] == pytest.approx(_reference_epsilon(sigmas[:t]), abs=1e-6)
    assert eps[-1] <= 4.0
    _, meta = _checkpoint(run)
    assert [(s["first"], s["last"], s["sigma"]) for s in meta["privacy"]["ledger"]] == [
        (1, 3, sigmas[0]), (4, 6, sigmas[3])]


def test_a_resume_within_the_same_total_keeps_sigma(tmp_path):
    """A run that stopped after its round-2 checkpoint, resumed to the same 4 rounds, keeps
    σ and spends (and reports) exactly the unbroken run's ε; resumed to more rounds, it
    would re-run the released rounds 3-4 at a new σ, and is refused."""
    cfg = _cfg("rounds=4", "checkpoint.every=2", "privacy.target_epsilon=6")
    run = tmp_path / "run"
    run_experiment(cfg, run, progress=False)
    unbroken = _records(run)
    ckpt = run / "checkpoints"
    (ckpt / "latest.json").write_text(json.dumps({"checkpoint": "round_00002.json"}))
    for f in ckpt.glob("round_00004.*"):
        f.unlink()
    # rounds 3-4 were released at σ: re-running them at another σ (a larger total) with the
    # same noise draws would reveal their sums, so that resume is refused
    with pytest.raises(ValueError, match=r"metrics.jsonl: rounds 3-4 were released after the "
                                         r"last checkpoint at noise_multiplier") as err:
        run_experiment(_cfg("rounds=8", "checkpoint.every=2", "privacy.target_epsilon=6"),
                       run, resume=True, progress=False)
    assert "\n" not in str(err.value)
    run_experiment(cfg, run, resume=True, progress=False)
    resumed = _records(run)
    sigma = unbroken[0]["dp_noise_multiplier"]
    assert {r["dp_noise_multiplier"] for r in resumed} == {sigma}
    assert [r["dp_epsilon"] for r in resumed] == [r["dp_epsilon"] for r in unbroken]
    assert resumed[-1]["dp_epsilon"] == pytest.approx(_reference_epsilon([sigma] * 4),
                                                      abs=1e-6)
    _, meta = _checkpoint(run)
    assert meta["privacy"]["ledger"] == [{"first": 1, "last": 4, "mode": "central",
                                          "sigma": sigma, "rate": Q, "steps": 1}]


def _tamper(run: Path, edit) -> Path:
    path, meta = _checkpoint(run)
    edit(meta)
    path.write_text(json.dumps(meta))
    return path


FIXED = ["privacy.noise_multiplier=1.0", "privacy.target_epsilon=null"]


@pytest.fixture(scope="module")
def two_rounds(tmp_path_factory) -> Path:
    """Two rounds at a fixed σ, checkpointed (copied by each test that edits it)."""
    run = tmp_path_factory.mktemp("ledger") / "run"
    run_experiment(_cfg(*FIXED, "rounds=2"), run, progress=False)
    return run


@pytest.mark.parametrize("edit", [
    lambda m: m.pop("privacy"),
    lambda m: m["privacy"]["ledger"][0].update(sigma="1.0"),
    lambda m: m["privacy"]["ledger"][0].update(last=1),  # covers rounds 1-1 of 2
    lambda m: m["privacy"]["ledger"][0].update(first=0),
    lambda m: m["privacy"]["ledger"][0].update(mode="none"),
    lambda m: m["privacy"]["ledger"][0].update(rate=1.5),
    lambda m: m["privacy"]["ledger"][0].update(extra=1),
    lambda m: m["privacy"].update(ledger={"first": 1}),
])
def test_a_malformed_ledger_is_refused_naming_the_checkpoint(two_rounds, tmp_path, edit):
    run = tmp_path / "run"
    shutil.copytree(two_rounds, run)
    path = _tamper(run, edit)
    where = re.escape(str(path))
    with pytest.raises(ValueError, match=f"^{where}: checkpoint field 'privacy.ledger") as err:
        run_experiment(_cfg(*FIXED, "rounds=3"), run, resume=True, progress=False)
    assert "\n" not in str(err.value)


def test_a_resume_beyond_the_target_is_refused_with_the_epsilon_spent(tmp_path):
    """Rounds 1-2 ran at σ = 0.5 (ε well past 4): no σ for rounds 3-4 keeps the run within
    the target, so the resume is refused rather than reported under budget."""
    run = tmp_path / "run"
    run_experiment(_cfg("rounds=2"), run, progress=False)
    path = _tamper(run, lambda m: m["privacy"]["ledger"][0].update(sigma=0.5))
    # the records agree (a ledger that disagrees with them is refused first)
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({**r, "dp_noise_multiplier": 0.5}) + "\n" for r in _records(run)))
    spent = _reference_epsilon([0.5, 0.5])
    where = re.escape(str(path))
    with pytest.raises(ValueError, match=rf"^{where}: ε = {spent:.4f} is already spent in "
                                         r"rounds 1-2; 2 more rounds would exceed "
                                         r"privacy.target_epsilon = 4.0") as err:
        run_experiment(_cfg("rounds=4"), run, resume=True, progress=False)
    assert "\n" not in str(err.value)


def test_a_fixed_sigma_resume_with_no_round_left_is_refused(tmp_path):
    """σ fixed and the target reached at round 2: a resume to 4 rounds had run 'rounds 3-2'
    and exited 0; now it is refused, giving the ε spent."""
    target = _reference_epsilon([1.0, 1.0]) + 1e-3
    over = ["privacy.noise_multiplier=1.0", f"privacy.target_epsilon={target}"]
    run = tmp_path / "run"
    run_experiment(_cfg("rounds=2", *over), run, progress=False)
    with pytest.raises(ValueError, match=r"^privacy.target_epsilon: ε = [0-9.]+ is already "
                                         r"spent in rounds 1-2, and round 3") as err:
        run_experiment(_cfg("rounds=4", *over), run, resume=True, progress=False)
    assert "\n" not in str(err.value)
    assert len(_records(run)) == 2


def test_zero_noise_with_a_target_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match=r"^privacy: noise_multiplier = 0 adds no noise") as err:
        _cfg("privacy.noise_multiplier=0")
    assert "\n" not in str(err.value)


def test_a_target_that_no_round_meets_is_refused(tmp_path):
    with pytest.warns(PrivacyWarning), pytest.raises(
            ValueError, match=r"^privacy.target_epsilon: round 1 at noise_multiplier 0.05 "
                              r"would spend ε = [0-9.]+ > 4.0"):
        run_experiment(_cfg("rounds=3", "privacy.noise_multiplier=0.05"), tmp_path / "run",
                       progress=False)
    assert not (tmp_path / "run" / "metrics.jsonl").is_file() or not _records(tmp_path / "run")


@pytest.mark.parametrize(("overrides", "field"), [
    (["privacy.delta=0.05"], "privacy.delta: 0.05 is at least 1/num_clients = 1/30"),
    (["privacy.noise_multiplier=0.1", "privacy.target_epsilon=null"],
     "privacy.noise_multiplier: 0.1 is below 0.3"),
])
def test_weak_settings_warn_in_one_line_naming_the_field(overrides, field):
    cfg = _cfg("privacy.noise_multiplier=1.0", "privacy.target_epsilon=null", *overrides)
    with pytest.warns(PrivacyWarning, match=f"^{field}") as caught:
        resolve(cfg.privacy, 3, 10, 30, 1)
    assert all("\n" not in str(w.message) for w in caught)


def test_sound_settings_do_not_warn(recwarn):
    resolve(_cfg("privacy.noise_multiplier=1.0").privacy, 3, 10, 30, 1)
    assert not [w for w in recwarn if issubclass(w.category, PrivacyWarning)]


def test_ledger_round_trips_through_the_checkpoint_meta():
    mech = resolve(_cfg("privacy.noise_multiplier=1.1", "privacy.target_epsilon=null").privacy,
                   5, 10, 30, 1)
    meta = {"round": 5, **{"privacy": mech.ledger_meta(5)}}
    assert from_meta(meta, "x.json") == mech.ledger(5) == (Span(1, 5, "central", 1.1, Q, 1),)
