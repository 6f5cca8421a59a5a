"""A part's diagnostics reach metrics.jsonl without the runner knowing the algorithm."""

from __future__ import annotations

from pathlib import Path

import torch

from fedforge.algorithms import ALGORITHMS
from fedforge.client.optimizers import local_optimizer
from fedforge.experiment.config import load_config
from fedforge.experiment.runner import run_experiment
from fedforge.protocol.algorithm import Algorithm, FinalizeInputs, Part
from fedforge.server.optimizers import server_sgd

ROOT = Path(__file__).resolve().parents[2]


class Visits(Part):
    """Counts each client's rounds; reports the steps taken and the share ever visited."""

    name = "visits"

    def client_init(self, params):
        return {"n": torch.zeros(())}

    def finalize(self, fin: FinalizeInputs):
        return {"n": fin.ctx.client_state[self.name]["n"] + 1}, {}

    def client_metrics(self, fin: FinalizeInputs):
        return {"steps_seen": fin.num_steps * 2}

    def server_metrics(self, server_state, client_states):
        return {"share_visited": (client_states["n"] > 0).double().mean()}


def visiting_fedavg(local_lr: float = 0.01) -> Algorithm:
    return Algorithm("visiting_fedavg", local_optimizer("sgd", local_lr), server_sgd(1.0),
                     parts=(Visits(),))


def test_client_and_server_diagnostics_are_logged(tmp_path, monkeypatch):
    monkeypatch.setitem(ALGORITHMS, "visiting_fedavg", visiting_fedavg)
    cfg = load_config(ROOT / "examples/quickstart.toml", [
        "rounds=2", "eval.every=1", "client.local_epochs=null", "client.local_steps=3",
        "algorithm.name=visiting_fedavg", "data.options.num_clients=10",
        "server.clients_per_round=4"])
    records = run_experiment(cfg, tmp_path / "run", progress=False)
    assert [r["steps_seen"] for r in records] == [6.0, 6.0]  # 3 steps each, times 2
    assert records[0]["share_visited"] == 0.4
    assert 0.4 <= records[1]["share_visited"] <= 0.8
