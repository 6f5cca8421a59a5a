"""FedAvg through the bridge on Flower's simulation engine (Ray) equals the fedforge run."""

from __future__ import annotations

import pytest

pytest.importorskip("flwr", reason="the Flower bridge needs `pip install 'fedforge[flower]'`")
pytest.importorskip("ray", reason="Flower's simulation engine needs `flwr[simulation]` (Ray)")

from flwr.simulation import run_simulation  # noqa: E402

from fedforge.flower import ServerOptions, build_apps  # noqa: E402

from .test_bridge import NUM_CLIENTS, assert_close, simulator_params, tiny_cfg  # noqa: E402


@pytest.mark.slow
def test_run_simulation_fedavg_equals_simulator(tmp_path):
    """2 rounds, 3 of 6 clients; tolerance 1e-5 (float32 summation order)."""
    cfg = tiny_cfg("rounds=2")
    final: dict = {}
    seen: list = []

    def on_round(t, params, info):
        seen.append(info)
        final.update({k: v.clone() for k, v in params.items()})

    server, client = build_apps(cfg, ServerOptions(round_timeout=120), on_round=on_round)
    run_simulation(server_app=server, client_app=client, num_supernodes=NUM_CLIENTS,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": 2}})
    assert len(seen) == 2 and all(len(i["accepted"]) == 3 and not i["rejected"] for i in seen)
    assert_close(final, simulator_params(cfg, tmp_path))
