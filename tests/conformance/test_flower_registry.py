"""Every registered algorithm through the Flower bridge (in process): it equals the simulator,
or the bridge refuses it when the run is built, in one line naming the algorithm."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("flwr", reason="the Flower bridge needs `pip install 'fedforge[flower]'`")

from fedforge.algorithms import ALGORITHMS, build_algorithm  # noqa: E402
from fedforge.flower import client_app, run_server  # noqa: E402
from fedforge.flower.server import FLOWER_SERVES  # noqa: E402
from tests.flower.fakegrid import FakeGrid  # noqa: E402
from tests.flower.test_bridge import (  # noqa: E402
    NUM_CLIENTS,
    assert_close,
    simulator_params,
    tiny_cfg,
)

# fedala: a fresh client's state is built from the initial model, in the bridge too (its
# local model once started from the model of the round the client was first sampled)
FAST = {"fedavg", "fedexp", "feddyn", "fetchsgd", "fedptr", "fedala"}


def _served(name: str) -> bool:
    return not (build_algorithm(name).needs({"w": torch.zeros(2)}) - FLOWER_SERVES)


@pytest.mark.parametrize("name", [pytest.param(n, marks=[] if n in FAST else [pytest.mark.slow])
                                  for n in sorted(ALGORITHMS)])
def test_bridge_serves_like_the_simulator_or_refuses(name, tmp_path):
    full = "full_participation" in build_algorithm(name).requires  # MARINA: every client
    cfg = tiny_cfg(f"algorithm.name={name}", "rounds=3",
                   *([f"server.clients_per_round={NUM_CLIENTS}"] if full else []))
    grid = FakeGrid(client_app(cfg), NUM_CLIENTS)
    if not _served(name):
        with pytest.raises(ValueError) as err:
            run_server(grid, cfg)
        message = str(err.value)
        assert "\n" not in message and name in message and "Flower bridge" in message
        return
    assert_close(run_server(grid, cfg), simulator_params(cfg, tmp_path))
