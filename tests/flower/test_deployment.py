"""A real localhost Flower deployment: SuperLink + 2 SuperNodes (``--insecure``) started as
subprocesses on 127.0.0.1, ``flwr run`` of a generated app directory, 3 rounds of FedAvg
through the bridge; the final model equals the fedforge simulator's. About 40 s (every
ClientApp call starts a fresh ``flwr-clientapp`` process that imports torch); it runs in CI
because the issue asks for a deployment test there (flwr is a test extra).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="the Flower bridge needs `pip install 'fedforge[flower]'`")
if shutil.which("flower-superlink") is None or shutil.which("flower-supernode") is None:
    pytest.skip("flower-superlink / flower-supernode not on PATH", allow_module_level=True)

from safetensors.torch import load_file  # noqa: E402

from fedforge.experiment.config import load_config  # noqa: E402

from .test_bridge import assert_close, simulator_params  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
OVERRIDES = ("rounds=3 data.options.num_clients=2 server.clients_per_round=2 "
             "client.local_steps=3 client.local_epochs=null")

PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fedforgeapp"
version = "1.0.0"
description = "fedforge through Flower"
license = "Apache-2.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "fedforge"

[tool.flwr.app.components]
serverapp = "fedforge.flower.app:server"
clientapp = "fedforge.flower.app:client"

[tool.flwr.app.config]
fedforge-config = "{config}"
fedforge-overrides = "{overrides}"
fedforge-out = "{out}"
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


def stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each started process group (the daemons' own children included), then KILL."""
    for p in reversed(procs):
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in reversed(procs):
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=5)


def test_localhost_deployment_three_rounds(tmp_path):
    config = REPO / "examples" / "quickstart.toml"
    out = tmp_path / "model.safetensors"
    app = tmp_path / "app"
    app.mkdir()
    (app / "pyproject.toml").write_text(
        PYPROJECT.format(config=config, overrides=OVERRIDES, out=out))
    home = tmp_path / "flwr_home"
    home.mkdir()
    link = free_port()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "local"\n\n[superlink.local]\n'
        f'address = "127.0.0.1:{link}"\ninsecure = true\n')
    env = {**os.environ, "FLWR_HOME": str(home), "OMP_NUM_THREADS": "1"}
    logs = tmp_path / "logs"
    logs.mkdir()
    procs: list[subprocess.Popen] = []

    def start(name: str, *args: str) -> None:
        procs.append(subprocess.Popen(args, env=env, cwd=tmp_path, start_new_session=True,
                                      stdout=(logs / f"{name}.log").open("w"),
                                      stderr=subprocess.STDOUT))

    try:
        start("superlink", "flower-superlink", "--insecure", "--port", str(link),
              "--database", str(tmp_path / "state.db"))
        wait_port(link, 30)
        for i in range(2):
            start(f"supernode{i}", "flower-supernode", "--insecure",
                  "--superlink", f"127.0.0.1:{link}", "--port", str(free_port()),
                  "--node-config", f"partition-id={i} num-partitions=2")
        run = subprocess.run(["flwr", "run", ".", "local", "--stream"], cwd=app, env=env,
                             capture_output=True, text=True, timeout=240)
        assert run.returncode == 0, run.stdout + run.stderr
        end = time.monotonic() + 60
        while not out.exists() and time.monotonic() < end:
            time.sleep(0.5)
        assert out.exists(), (logs / "superlink.log").read_text()[-3000:]
    finally:
        stop(procs)
    rounds = (tmp_path / "model.rounds.jsonl").read_text().splitlines()
    assert len(rounds) == 3 and all('"rejected": []' in r for r in rounds)
    cfg = load_config(str(config), OVERRIDES.split())
    assert_close(load_file(out), simulator_params(cfg, tmp_path))
