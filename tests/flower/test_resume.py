"""The Flower server drives the one run loop: a run folder, checkpoints and resume.

In-process (fake Grid, a few seconds): a ServerApp stopped mid-round after a checkpoint and
started again with ``fedforge-resume`` ends with the uninterrupted run's model, records and
``model.rounds.jsonl``, bit for bit, for FedAdam (whose server moments must come back from
the checkpoint); what cannot resume is refused in one line. ``test_deployment.py`` kills a
real ServerApp process on localhost.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("flwr", reason="the Flower bridge needs `pip install 'fedforge[flower]'`")

from safetensors.torch import load_file  # noqa: E402

from fedforge.experiment.rundir import RunDirError  # noqa: E402
from fedforge.flower import ServerOptions, client_app, run_server  # noqa: E402
from fedforge.flower.app import run_folder_from_run, serve  # noqa: E402

from . import interop_app  # noqa: E402
from .fakegrid import FakeGrid  # noqa: E402
from .test_bridge import NUM_CLIENTS, tiny_cfg  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
RUN = ("rounds=5", "checkpoint.every=2", "eval.every=1", "algorithm.name=fedadam",
       "algorithm.server_lr=0.05")


class Killed(Exception):
    """Stands in for SIGKILL: the server stops in the middle of a round."""


class DyingGrid(FakeGrid):
    """A fake Grid whose server dies when it sends round ``die_at``'s TRAIN messages."""

    def __init__(self, app, num_nodes: int, die_at: int) -> None:
        super().__init__(app, num_nodes)
        self.die_at = die_at

    def send_and_receive(self, messages, *, timeout=None):
        if any(m.metadata.group_id == str(self.die_at) for m in messages):
            raise Killed(f"killed in round {self.die_at}")
        return super().send_and_receive(messages, timeout=timeout)


def run_config(tmp_path: Path, name: str, **extra) -> dict:
    return {"fedforge-config": str(REPO / "examples" / "quickstart.toml"),
            "fedforge-overrides": " ".join(
                ["rounds=2", f"data.options.num_clients={NUM_CLIENTS}",
                 "server.clients_per_round=3", "client.local_steps=3",
                 "client.local_epochs=null", *RUN]),
            "fedforge-out": str(tmp_path / f"{name}.safetensors"),
            "fedforge-run-dir": str(tmp_path / name), **extra}


def records(run_dir: Path) -> list[dict]:
    """``metrics.jsonl`` without the wall-clock seconds."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if k != "wall_s"} for x in lines]


def test_killed_server_resumes_to_the_uninterrupted_run(tmp_path):
    """Checkpoints at rounds 2 and 4 of 5; the server dies sending round 5 (round 4 logged
    and checkpointed) in one run, and round 4 (round 3 logged, checkpoint 2) in another:
    the resumed log is cut back to the checkpoint and rounds on from it."""
    cfg = tiny_cfg(*RUN)
    ref_config = run_config(tmp_path, "ref")
    serve(FakeGrid(client_app(cfg), NUM_CLIENTS), ref_config)
    want = load_file(ref_config["fedforge-out"])
    for die_at in (5, 4):
        name = f"died{die_at}"
        with pytest.raises(Killed):
            serve(DyingGrid(client_app(cfg), NUM_CLIENTS, die_at), run_config(tmp_path, name))
        logged = [r["round"] for r in records(tmp_path / name)]
        assert logged == list(range(1, die_at))
        resumed = run_config(tmp_path, name, **{"fedforge-resume": True})
        serve(FakeGrid(client_app(cfg), NUM_CLIENTS), resumed)  # fresh nodes, as on restart
        got = load_file(resumed["fedforge-out"])
        assert all(torch.equal(got[k], want[k]) for k in want)
        assert records(tmp_path / name) == records(tmp_path / "ref")
        rounds = (tmp_path / f"{name}.rounds.jsonl").read_text()
        assert rounds == (tmp_path / "ref.rounds.jsonl").read_text()
    final = records(tmp_path / "ref")[-1]
    assert final["bytes_up_total"] == 5 * 3 * 4 * 610  # counted once per round, resumed too


def test_plain_flower_clients_resume_under_standard_messages(tmp_path):
    """Flower's standard messages (plain Flower ClientApps, FedAdam, a cohort of 3 drawn over
    the 6 connected nodes each round): stopped in round 4, resumed, equal to the
    uninterrupted run bit for bit."""
    cfg = tiny_cfg(*RUN)
    options = ServerOptions(protocol="flower")
    want = run_server(FakeGrid(interop_app.plain_client, NUM_CLIENTS), cfg, options,
                      out_dir=tmp_path / "ref")
    with pytest.raises(Killed):
        run_server(DyingGrid(interop_app.plain_client, NUM_CLIENTS, 4), cfg, options,
                   out_dir=tmp_path / "died")
    got = run_server(FakeGrid(interop_app.plain_client, NUM_CLIENTS), cfg, options,
                     out_dir=tmp_path / "died", resume=True)
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert records(tmp_path / "died") == records(tmp_path / "ref")


def test_resume_refuses_what_it_cannot_continue(tmp_path):
    """A run folder holding a run needs resume or overwrite; a resume may not change which
    replies count, nor continue an algorithm whose client state lived on the nodes."""
    cfg = tiny_cfg("rounds=2")
    out = tmp_path / "run"
    grid = FakeGrid(client_app(cfg), NUM_CLIENTS)
    run_server(grid, cfg, out_dir=out)
    with pytest.raises(RunDirError, match="holds an earlier run; pass --resume"):
        run_server(grid, cfg, out_dir=out)
    longer = tiny_cfg("rounds=3")
    with pytest.raises(ValueError, match="server option max_norm_ratio is 5.0, the run was "
                                         "started with 10.0; a resume may change only"):
        run_server(grid, longer, ServerOptions(max_norm_ratio=5.0), out_dir=out, resume=True)
    run_server(grid, longer, ServerOptions(round_timeout=60.0), out_dir=out, resume=True)
    assert [r["round"] for r in records(out)] == [1, 2, 3]

    scaffold = tiny_cfg("rounds=2", "algorithm.name=scaffold")
    grid = FakeGrid(client_app(scaffold), NUM_CLIENTS)
    run_server(grid, scaffold, out_dir=tmp_path / "scaffold")
    with pytest.raises(ValueError, match=r"round_00002\.json: algorithm 'scaffold' keeps "
                                         "per-client state on the nodes") as err:
        run_server(grid, tiny_cfg("rounds=3", "algorithm.name=scaffold"),
                   out_dir=tmp_path / "scaffold", resume=True)
    assert "\n" not in str(err.value)


def test_run_folder_keys_of_the_run_config():
    assert run_folder_from_run({}) == (None, False, False)
    assert run_folder_from_run({"fedforge-run-dir": "runs/a", "fedforge-resume": True}) == (
        "runs/a", True, False)
    with pytest.raises(ValueError, match="^run config: fedforge-resume: expected true or "
                                         "false, got 'yes'$"):
        run_folder_from_run({"fedforge-run-dir": "runs/a", "fedforge-resume": "yes"})
    with pytest.raises(ValueError, match="need fedforge-run-dir"):
        run_folder_from_run({"fedforge-resume": True})


def test_deployable_server_names_its_run_config_keys(tmp_path):
    """A second start into a run folder that holds a run says which run config key to set."""
    cfg = tiny_cfg(*RUN)
    conf = run_config(tmp_path, "a")
    conf["fedforge-overrides"] = conf["fedforge-overrides"].replace("rounds=5", "rounds=1")
    serve(FakeGrid(client_app(cfg), NUM_CLIENTS), conf)
    with pytest.raises(RunDirError, match="holds an earlier run; pass fedforge-resume = true "
                                          "to continue it or fedforge-overwrite = true"):
        serve(FakeGrid(client_app(cfg), NUM_CLIENTS), conf)
