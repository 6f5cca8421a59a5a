"""SecAgg+ on localhost: a SuperLink, three SuperNodes and ``flwr run`` of the
``fedforge.flower.secagg`` apps. The unmasked aggregate equals the plain-text mean of the
nodes' deltas within SecAgg+'s quantisation error, and a round in which one node drops out
after the key exchange still completes with the other two. 2-6 minutes each (slow)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="the Flower bridge needs `pip install 'fedforge[flower]'`")
if shutil.which("flower-superlink") is None or shutil.which("flower-supernode") is None:
    pytest.skip("flower-superlink / flower-supernode not on PATH", allow_module_level=True)

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from fedforge.experiment.config import load_config  # noqa: E402
from fedforge.flower.client import solo_train  # noqa: E402
from fedforge.flower.common import experiment  # noqa: E402
from tests.flower.test_deployment import PYPROJECT, Deployment  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "examples" / "quickstart.toml"
OVERRIDES = ("rounds=1 data.options.num_clients=3 server.clients_per_round=3 "
             "client.local_steps=3 client.local_epochs=null")
CLIP = 8.0
QUANT = 2**22  # SecAgg+'s default quantization range
DROPPING_APP = '''\
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp

from fedforge.flower.app import config_from_run
from fedforge.flower.client import partition_of
from fedforge.flower.secagg import DeltaClient


class Dropping(DeltaClient):
    def fit(self, parameters, config):
        if self.partition == 2:  # after the key exchange: its masks must be removed
            raise RuntimeError("node 2 drops out")
        return super().fit(parameters, config)


client = ClientApp(client_fn=lambda ctx: Dropping(config_from_run(ctx.run_config),
                                                  partition_of(ctx)).to_client(),
                   mods=[secaggplus_mod])
'''


def _app(folder: Path, out: Path, clientapp: str) -> Path:
    folder.mkdir()
    text = PYPROJECT.format(config=CONFIG, overrides=OVERRIDES, out=out,
                            serverapp="fedforge.flower.secagg:server", clientapp=clientapp)
    text += "fedforge-secagg-shares = 3\nfedforge-secagg-threshold = 2\n"
    (folder / "pyproject.toml").write_text(text)
    (folder / "dropping.py").write_text(DROPPING_APP)
    return folder


def _run(d: Deployment, app: Path, out: Path) -> None:
    """``flwr run`` with a longer limit than the plain bridge's: SecAgg+ takes four message
    rounds, each starting a fresh ClientApp process per node."""
    run = subprocess.run(["flwr", "run", ".", "local", "--stream"], cwd=app, env=d.env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    end = time.monotonic() + 60  # the ServerApp writes the model as it exits
    while not out.exists() and time.monotonic() < end:
        time.sleep(0.5)
    assert out.exists(), run.stdout[-3000:] + d.log("superlink")[-2000:]


def _plain_mean_step(nodes: list[int]) -> dict:
    """x0 - mean_i Δ_i over ``nodes`` (FedAvg's server step, lr 1), computed in-process."""
    cfg = load_config(str(CONFIG), OVERRIDES.split())
    exp, _ = experiment(cfg)
    x0 = exp.initial_params()
    deltas = [solo_train(cfg, 1, i, x0)[0] for i in nodes]
    return {k: x0[k] - sum(d[k] for d in deltas) / len(deltas) for k in x0}


@pytest.mark.slow
@pytest.mark.parametrize("dropout", [False, True])
def test_secaggplus_sum_on_localhost(tmp_path: Path, dropout: bool) -> None:
    out = tmp_path / "model.safetensors"
    clientapp = "dropping:client" if dropout else "fedforge.flower.secagg:client"
    app = _app(tmp_path / "app", out, clientapp)
    d = Deployment(tmp_path, secure=False)
    try:
        for i in range(3):
            d.node(f"supernode{i}", i, 3)
        _run(d, app, out)
    finally:
        d.close()
    log = [json.loads(x) for x in out.with_suffix(".rounds.jsonl").read_text().splitlines()]
    nodes = [0, 1] if dropout else [0, 1, 2]
    assert log == [{"round": 1, "nodes": len(nodes)}]
    want = _plain_mean_step(nodes)
    got = load_file(out)
    # each coordinate of each delta is quantised with step 2·CLIP/QUANT; the mean keeps that
    for k, v in want.items():
        torch.testing.assert_close(got[k], v.float(), atol=2 * CLIP / QUANT * 2, rtol=0)


def test_algorithms_with_per_client_server_values_are_refused():
    from fedforge.flower.secagg import check_secagg

    for name, what in [("scaffold", "uploads"), ("fedexp", "uploads"), ("safl", "codec")]:
        cfg = load_config(str(CONFIG), [*OVERRIDES.split(), f"algorithm.name={name}"])
        with pytest.raises(ValueError, match=f"'{name}' cannot run under SecAgg\\+.*{what}"):
            check_secagg(cfg)
    cfg = load_config(str(CONFIG), [*OVERRIDES.split(), "privacy.mode=central",
                                    "privacy.noise_multiplier=1.0"])
    with pytest.raises(ValueError, match="privacy.mode: SecAgg"):
        check_secagg(cfg)


def test_the_plain_flower_bridge_refuses_privacy():
    from fedforge.flower.server import ServerOptions, check_supported

    cfg = load_config(str(CONFIG), [*OVERRIDES.split(), "privacy.mode=local",
                                    "privacy.noise_multiplier=1.0"])
    exp, _ = experiment(cfg)
    with pytest.raises(ValueError, match="^privacy.mode: the Flower bridge sends plain"):
        check_supported(exp, ServerOptions())
