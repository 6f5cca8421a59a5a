"""What a Flower run tells its user, in-process (fast): every round's loss and accuracy in the
console line and in ``model.rounds.jsonl``, equal to the simulator's ``metrics.jsonl``; SecAgg+
settings refused at start in one line naming the key; a failing ServerApp's one ERROR line;
and the documented app (``examples/flower_app``) shown verbatim in docs/scale-out.md."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="the Flower bridge needs `pip install 'fedforge[flower]'`")

from fedforge.experiment.config import load_config  # noqa: E402
from fedforge.experiment.runner import run_experiment  # noqa: E402
from fedforge.flower import ServerOptions, client_app, run_server  # noqa: E402
from fedforge.flower.app import failing_loudly, options_from_run, serve  # noqa: E402
from fedforge.flower.secagg import secagg_settings  # noqa: E402

from .fakegrid import FakeGrid  # noqa: E402
from .test_bridge import NUM_CLIENTS, tiny_cfg  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "flower_app"
KEYS = ("train_loss", "test_loss", "test_accuracy")


def _sim_rounds(cfg, tmp_path: Path) -> list[dict]:
    run_experiment(cfg, tmp_path / "sim", progress=False)
    lines = (tmp_path / "sim" / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "round" in r]


def test_every_round_logs_loss_and_accuracy_as_the_simulator(tmp_path, caplog):
    cfg = tiny_cfg("rounds=3", "eval.every=1")
    seen: list[dict] = []
    with caplog.at_level(logging.INFO, logger="fedforge.flower"):
        run_server(FakeGrid(client_app(cfg), NUM_CLIENTS), cfg,
                   on_round=lambda t, p, info: seen.append(info))
    want = _sim_rounds(cfg, tmp_path)
    assert len(seen) == len(want) == 3
    for got, ref in zip(seen, want):
        for key in KEYS:
            assert got[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-6), key
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("round ")]
    assert lines == [f"round {t}/3: train_loss {i['train_loss']:.4f}, test_loss "
                     f"{i['test_loss']:.4f}, test_accuracy {i['test_accuracy']:.4f} "
                     "(3 of 3 replies accepted)" for t, i in enumerate(seen, 1)]


def test_eval_every_evaluates_those_rounds_and_the_last():
    cfg = tiny_cfg("rounds=3")
    seen: list[dict] = []
    run_server(FakeGrid(client_app(cfg), NUM_CLIENTS), cfg, ServerOptions(eval_every=2),
               on_round=lambda t, p, info: seen.append(info))
    assert ["test_accuracy" in i for i in seen] == [False, True, True]
    assert all(i["train_loss"] > 0 for i in seen)
    assert options_from_run({"fedforge-eval-every": 0}).eval_every is None
    with pytest.raises(ValueError, match="^run config: fedforge-eval-every: expected >= 1"):
        options_from_run({"fedforge-eval-every": -1})


def test_deployable_server_writes_rounds_jsonl_from_the_app_folder(tmp_path):
    """The deployable ServerApp's body with the example's run config (relative
    ``fedforge-config`` read from the app folder): one JSON line per round with the losses
    and the accuracy, emptied at each run."""
    cfg = load_config(str(EXAMPLE / "fedforge.toml"), [])
    out = tmp_path / "model.safetensors"
    run_config = {"fedforge-config": "fedforge.toml", "fedforge-out": str(out)}
    for _ in range(2):  # a second run replaces the first run's lines
        serve(FakeGrid(client_app(cfg), 2), run_config, EXAMPLE)
    rounds = [json.loads(x) for x in out.with_suffix(".rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [1, 2, 3]
    assert all(isinstance(r[k], float) for r in rounds for k in KEYS)
    with pytest.raises(ValueError, match="^run config: fedforge-config: no file"):
        serve(FakeGrid(client_app(cfg), 2), run_config, tmp_path)


def _example_run_config() -> dict:
    import tomllib

    text = (EXAMPLE / "pyproject.toml").read_text()
    return tomllib.loads(text)["tool"]["flwr"]["app"]["config"]


@pytest.mark.parametrize(("settings", "nodes", "message"), [
    ({}, 2, "run config: fedforge-secagg-shares: 2 (default: server.clients_per_round = 2); "
            "SecAgg+ needs more than 2 shares, so at least 3 nodes per round "
            "(server.clients_per_round >= 3)"),
    ({"fedforge-secagg-shares": 4}, 3,
     "run config: fedforge-secagg-shares: 4 exceeds the 3 nodes sampled per round "
     "(server.clients_per_round)"),
    ({"fedforge-secagg-shares": 3, "fedforge-secagg-threshold": 3}, 3,
     "run config: fedforge-secagg-threshold: 3; expected at least 2 and fewer than the 3 "
     "shares (fedforge-secagg-shares)"),
    ({"fedforge-secagg-threshold": 1}, 5, "run config: fedforge-secagg-threshold: 1; "),
    ({"fedforge-secagg-shares": "3"}, 3, "run config: fedforge-secagg-shares: expected an "
                                         "integer, got '3'"),
    ({"fedforge-secagg-clip": 0}, 3, "run config: fedforge-secagg-clip: expected a positive"),
])
def test_secagg_settings_refused_in_one_line(settings, nodes, message):
    """The documented set-up (2 nodes, the example's run config) first: Flower's own check
    would only fire inside the workflow, as a traceback."""
    run_config = {**_example_run_config(), **settings}
    with pytest.raises(ValueError) as err:
        secagg_settings(run_config, nodes)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_secagg_settings_accepted():
    got = secagg_settings({"fedforge-round-timeout": 0}, 3)
    assert (got.shares, got.threshold, got.clip, got.timeout) == (3, 2, 8.0, None)
    got = secagg_settings({"fedforge-secagg-shares": 5, "fedforge-round-timeout": 60}, 7)
    assert (got.shares, got.threshold, got.timeout) == (5, 4, 60.0)


def test_a_failing_server_app_logs_one_error_line_and_raises(caplog):
    with caplog.at_level(logging.INFO, logger="fedforge.flower"):
        with pytest.raises(ValueError, match="fedforge-secagg-shares"):
            with failing_loudly():
                raise ValueError("run config: fedforge-secagg-shares: 2\nsecond line")
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in errors] == [
        "fedforge: the run failed: run config: fedforge-secagg-shares: 2"]


def test_docs_show_the_example_app_verbatim():
    """docs/scale-out.md shows each file of examples/flower_app as a fenced block, unchanged:
    the deployment test runs these files, so the docs cannot drift from what was run."""
    docs = (REPO / "docs" / "scale-out.md").read_text()
    for name, lang in [("pyproject.toml", "toml"), ("fedforge_app.py", "python"),
                       ("fedforge.toml", "toml"), ("flwr-config.toml", "toml")]:
        text = (EXAMPLE / name).read_text()
        assert f"```{lang}\n{text}```" in docs, name
    assert re.search(r"flwr run \. local --stream", docs)
