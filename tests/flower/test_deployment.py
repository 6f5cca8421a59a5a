"""Real localhost Flower deployments: a SuperLink and SuperNodes started as subprocesses on
127.0.0.1 and ``flwr run`` of app directories.

* the documented app (``examples/flower_app``, copied file for file, docs/scale-out.md shows
  the same files): 3 rounds of FedAvg equal the fedforge simulator, ``--insecure`` and over
  TLS with SuperNode authentication (a throwaway CA and node keys made here with
  ``cryptography``, no openssl CLI): the registered nodes train, a node with an unregistered
  key is turned away by the SuperLink; every round's loss and accuracy are on the streamed
  console and in ``model.rounds.jsonl``, equal to the simulator's ``metrics.jsonl``;
* the same app with SecAgg+ components on the documented 2 nodes stops at start with one
  ERROR line naming ``fedforge-secagg-shares``, and Flower records the run as failed;
* interoperability: fedforge's ClientApp under Flower's ``FedAvg`` ServerApp, and a plain
  Flower ClientApp under fedforge's ServerApp, each equal to the same run in-process.
* resume (slow): the example app's ServerApp process SIGKILLed after a checkpoint and started
  again with ``fedforge-resume=true`` ends with the uninterrupted run's model and records.

40-120 s each (every ClientApp call starts a fresh ``flwr-clientapp`` process that imports
torch); they run in CI (flwr is a test extra).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("flwr", reason="the Flower bridge needs `pip install 'fedforge[flower]'`")
if shutil.which("flower-superlink") is None or shutil.which("flower-supernode") is None:
    pytest.skip("flower-superlink / flower-supernode not on PATH", allow_module_level=True)

from cryptography import x509  # noqa: E402  (a dependency of flwr)
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: E402
from flwr.app import ArrayRecord  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from fedforge.experiment.config import load_config  # noqa: E402
from fedforge.flower import ServerOptions, client_app, run_server  # noqa: E402
from fedforge.flower.app import serve  # noqa: E402
from fedforge.flower.common import experiment  # noqa: E402

from . import interop_app  # noqa: E402
from .fakegrid import FakeGrid  # noqa: E402
from .test_bridge import assert_close, simulator_params  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "flower_app"
EXAMPLE_FILES = ("pyproject.toml", "fedforge_app.py", "fedforge.toml", "flwr-config.toml")
EXAMPLE_ADDRESS = "127.0.0.1:18100"  # the example connection's SuperLink address
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
serverapp = "{serverapp}"
clientapp = "{clientapp}"

[tool.flwr.app.config]
fedforge-config = "{config}"
fedforge-overrides = "{overrides}"
fedforge-out = "{out}"
fedforge-round-timeout = 300
"""
FEDFORGE_APPS = {"serverapp": "fedforge.flower.app:server",
                 "clientapp": "fedforge.flower.app:client"}


def make_certs(folder: Path) -> tuple[Path, Path, Path]:
    """Write a throwaway CA and a server certificate for 127.0.0.1 / localhost into ``folder``.

    Returns ``(ca.crt, server.pem, server.key)``. EC P-256 keys: generated in milliseconds.
    The server certificate's SANs must name the address the SuperNodes and ``flwr`` dial.
    """
    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)
    start, end = now - dt.timedelta(minutes=5), now + dt.timedelta(days=1)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder()
          .subject_name(name("fedforge test CA")).issuer_name(name("fedforge test CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(
              digital_signature=True, key_cert_sign=True, crl_sign=True,
              content_commitment=False, key_encipherment=False, data_encipherment=False,
              key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                         critical=False)
          .sign(ca_key, hashes.SHA256()))

    key = ec.generate_private_key(ec.SECP256R1())
    server = (x509.CertificateBuilder()
              .subject_name(name("localhost")).issuer_name(ca.subject)
              .public_key(key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(start).not_valid_after(end)
              .add_extension(x509.SubjectAlternativeName([
                  x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                  x509.DNSName("localhost")]), critical=False)
              .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
              .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                             critical=False)
              .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                  ca_key.public_key()), critical=False)
              .sign(ca_key, hashes.SHA256()))

    paths = folder / "ca.crt", folder / "server.pem", folder / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


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


def tls_handshake(port: int, ca: Path) -> None:
    """Fail unless the port speaks TLS with a certificate the CA vouches for, for 127.0.0.1."""
    ctx = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            assert s.version() is not None


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




def node_key(folder: Path, name: str) -> tuple[Path, Path]:
    """A SuperNode's EC P-256 key pair in OpenSSH format (what ``flower-supernode
    --auth-supernode-private-key`` and ``flwr supernode register`` read)."""
    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    private, public = folder / f"{name}.key", folder / f"{name}.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.OpenSSH,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                     serialization.PublicFormat.OpenSSH))
    return private, public


class Deployment:
    """A SuperLink and SuperNodes on 127.0.0.1 (subprocesses, own process groups), and the
    ``flwr`` CLI pointed at them through ``$FLWR_HOME/config.toml``."""

    def __init__(self, tmp_path: Path, *, secure: bool, auth: bool = False) -> None:
        self.tmp, self.procs, self.link = tmp_path, [], free_port()
        self.logs = tmp_path / "logs"
        self.logs.mkdir()
        if secure:
            ca, cert, key = make_certs(tmp_path / "certs")
            link_flags = ["--ssl-ca-certfile", str(ca), "--ssl-certfile", str(cert),
                          "--ssl-keyfile", str(key)]
            self.node_flags = ["--root-certificates", str(ca)]
            connection = f'root-certificates = "{ca}"'  # flwr wants an absolute path here
        else:
            link_flags, self.node_flags, connection = ["--insecure"], ["--insecure"], None
        if auth:
            link_flags.append("--enable-supernode-auth")
        home = tmp_path / "flwr_home"
        home.mkdir()
        (home / "config.toml").write_text(example_connection(self.link, connection))
        self.env = {**os.environ, "FLWR_HOME": str(home), "OMP_NUM_THREADS": "1"}
        self.start("superlink", "flower-superlink", *link_flags, "--port", str(self.link),
                   "--database", str(tmp_path / "state.db"))
        wait_port(self.link, 30)
        if secure:
            tls_handshake(self.link, ca)

    def start(self, name: str, *args: str) -> subprocess.Popen:
        proc = subprocess.Popen(args, env=self.env, cwd=self.tmp, start_new_session=True,
                                stdout=(self.logs / f"{name}.log").open("w"),
                                stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def node(self, name: str, partition: int, partitions: int, *auth: str) -> subprocess.Popen:
        return self.start(name, "flower-supernode", *self.node_flags, *auth,
                          "--superlink", f"127.0.0.1:{self.link}", "--port", str(free_port()),
                          "--node-config", f"partition-id={partition} num-partitions={partitions}")

    def register(self, public_key: Path) -> None:
        """``flwr supernode register``: the SuperLink will accept this key's node."""
        out = subprocess.run(["flwr", "supernode", "register", str(public_key), "local"],
                             env=self.env, cwd=self.tmp, capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0 and "registered" in out.stdout, out.stdout + out.stderr

    def run(self, app: Path, out: Path | None, *flags: str) -> str:
        """``flwr run . local --stream`` in the app directory, as the docs say; wait for the
        ServerApp to write ``out``. Returns the streamed output."""
        run = subprocess.run(["flwr", "run", ".", "local", "--stream", *flags], cwd=app,
                             env=self.env,
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout + run.stderr
        end = time.monotonic() + 60
        while out is not None and not out.exists() and time.monotonic() < end:
            time.sleep(0.5)
        assert out is None or out.exists(), run.stdout[-3000:] + self.log("superlink")[-3000:]
        return re.sub(r"\x1b\[[0-9;]*m", "", run.stdout + run.stderr)  # no colours

    def status(self, output: str) -> str:
        """The status ``flwr ls`` reports for the run ``flwr run`` started in ``output``."""
        run_id = re.search(r"Successfully started run (\d+)", output).group(1)
        end = time.monotonic() + 60
        while True:
            ls = subprocess.run(["flwr", "ls", "local", "--run-id", run_id, "--format", "json"],
                                env=self.env, cwd=self.tmp, capture_output=True, text=True,
                                timeout=60)
            runs = json.loads(ls.stdout)["runs"]
            status = runs[0]["status"]
            if status.startswith("finished") or time.monotonic() > end:
                return status
            time.sleep(1)

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text()

    def close(self) -> None:
        stop(self.procs)


def example_connection(port: int, connection: str | None = None) -> str:
    """The example's ``flwr-config.toml`` with this SuperLink's port (and, over TLS, the CA
    instead of ``insecure = true``)."""
    text = (EXAMPLE / "flwr-config.toml").read_text()
    assert EXAMPLE_ADDRESS in text and "insecure = true" in text
    text = text.replace(EXAMPLE_ADDRESS, f"127.0.0.1:{port}")
    return text if connection is None else text.replace("insecure = true", connection)


def copy_example(folder: Path, **components: str) -> Path:
    """``examples/flower_app`` file for file; ``components`` swaps the app's components
    (``serverapp="fedforge_app:secagg_server"``) as the docs tell a user to."""
    folder.mkdir()
    for name in EXAMPLE_FILES:
        shutil.copy(EXAMPLE / name, folder / name)
    toml = folder / "pyproject.toml"
    for key, value in components.items():
        text = toml.read_text()
        old = re.search(rf'^{key} = ".*"$', text, re.M).group(0)
        toml.write_text(text.replace(old, f'{key} = "{value}"'))
    return folder


def rounds_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def make_app(folder: Path, out: Path, overrides: str = OVERRIDES, **components: str) -> Path:
    """An app directory: ``pyproject.toml`` (fedforge's apps unless ``components`` name
    others) and a copy of ``interop_app.py`` as module ``interop``."""
    folder.mkdir()
    (folder / "pyproject.toml").write_text(PYPROJECT.format(
        config=REPO / "examples" / "quickstart.toml", overrides=overrides, out=out,
        **{**FEDFORGE_APPS, **components}))
    shutil.copy(Path(interop_app.__file__), folder / "interop.py")
    return folder


@pytest.mark.parametrize("mode", ["insecure", "tls_auth"])
def test_documented_app_on_localhost(tmp_path: Path, mode: str) -> None:
    """The documented app and commands: 2 SuperNodes, ``flwr run . local --stream``. Equal to
    the simulator (model and every round's losses and accuracy). ``tls_auth`` adds TLS,
    SuperNode authentication (the two nodes' public keys registered with ``flwr supernode
    register``) and a rogue node whose key is not registered, claiming partition 0: the
    SuperLink never lets it in."""
    out = tmp_path / "model.safetensors"  # fedforge-out, relative to the SuperLink's folder
    app = copy_example(tmp_path / "app")
    d = Deployment(tmp_path, secure=mode == "tls_auth", auth=mode == "tls_auth")
    try:
        if mode == "tls_auth":
            for i in range(2):
                private, public = node_key(tmp_path / "keys", f"node{i}")
                d.register(public)
                d.node(f"supernode{i}", i, 2, "--auth-supernode-private-key", str(private))
            rogue_key, _ = node_key(tmp_path / "keys", "rogue")
            rogue = d.node("rogue", 0, 2, "--auth-supernode-private-key", str(rogue_key))
        else:
            for i in range(2):
                d.node(f"supernode{i}", i, 2)
        console = d.run(app, out)
        if mode == "tls_auth":
            assert rogue.wait(timeout=60) != 0
            assert "Failed to activate SuperNode" in d.log("rogue")
    finally:
        d.close()
    rounds = rounds_of(tmp_path / "model.rounds.jsonl")
    assert len(rounds) == 3
    assert all(r["accepted"] == [0, 1] and not r["rejected"] and r["nodes"] == 2 for r in rounds)
    assert not rounds[0]["refused_nodes"]
    cfg = load_config(str(EXAMPLE / "fedforge.toml"), [])
    assert_close(load_file(out), simulator_params(cfg, tmp_path))
    sim = rounds_of(tmp_path / "sim" / "metrics.jsonl")
    for got, want in zip(rounds, sim, strict=True):
        for key in ("train_loss", "test_loss", "test_accuracy"):
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), key
        line = (f"round {got['round']}/3: train_loss {got['train_loss']:.4f}, "
                f"test_loss {got['test_loss']:.4f}, test_accuracy {got['test_accuracy']:.4f} "
                "(2 of 2 replies accepted)")
        assert line in console, console[-3000:]


def test_secagg_on_two_nodes_fails_at_start_in_one_line(tmp_path: Path) -> None:
    """The documented 2-node set-up with the SecAgg+ components: the ServerApp stops before
    any round with one ERROR line naming the setting, and Flower records the run as failed
    (``flwr run`` itself exits 0 once the run is submitted)."""
    app = copy_example(tmp_path / "app", serverapp="fedforge_app:secagg_server",
                       clientapp="fedforge_app:secagg_client")
    d = Deployment(tmp_path, secure=False)
    try:
        console = d.run(app, None)
        status = d.status(console)
    finally:
        d.close()
    errors = [line for line in console.splitlines() if "fedforge: the run failed" in line]
    assert len(errors) == 1, console[-3000:]
    assert errors[0].startswith("ERROR")
    assert errors[0].endswith("fedforge: the run failed: run config: fedforge-secagg-shares: 2 "
                              "(default: server.clients_per_round = 2); SecAgg+ needs more "
                              "than 2 shares, so at least 3 nodes per round "
                              "(server.clients_per_round >= 3)"), errors[0]
    assert status == "finished:failed", status
    assert not (tmp_path / "model.rounds.jsonl").exists()


def test_flower_interop_on_localhost(tmp_path: Path) -> None:
    """One SuperLink, two SuperNodes, two runs: (a) Flower's ``FedAvg`` ServerApp with
    fedforge's ClientApp, (b) fedforge's ServerApp (``fedforge-protocol = "flower"``) with a
    plain Flower ClientApp. Each equals the same apps run in-process (1e-5)."""
    fedavg = OVERRIDES + " server.aggregation=num_samples"
    out_a, out_b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    app_a = make_app(tmp_path / "app_a", out_a, fedavg, serverapp="interop:flower_server")
    app_b = make_app(tmp_path / "app_b", out_b, fedavg, clientapp="interop:plain_client")
    with (app_b / "pyproject.toml").open("a") as f:
        f.write('fedforge-protocol = "flower"\n')
    d = Deployment(tmp_path, secure=False)
    try:
        for i in range(2):
            d.node(f"supernode{i}", i, 2)
        d.run(app_a, out_a)
        d.run(app_b, out_b)
    finally:
        d.close()
    cfg = load_config(str(REPO / "examples" / "quickstart.toml"), fedavg.split())
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=2,
                      min_available_nodes=2)
    ref_a = strategy.start(grid=FakeGrid(client_app(cfg), 2), num_rounds=cfg.rounds,
                           initial_arrays=ArrayRecord(experiment(cfg)[0].initial_params()))
    assert_close(load_file(out_a), ref_a.arrays.to_torch_state_dict())
    ref_b = run_server(FakeGrid(interop_app.plain_client, 2), cfg,
                       ServerOptions(protocol="flower"))
    assert_close(load_file(out_b), ref_b)
    rounds = [json.loads(r) for r in (tmp_path / "b.rounds.jsonl").read_text().splitlines()]
    assert len(rounds) == 3 and all(len(r["accepted"]) == 2 and not r["rejected"]
                                    for r in rounds)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux ``/proc``): the SuperLink's SuperExec starts each
    run's ``flwr-serverapp`` in a session of its own, so no process group holds them all."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def serverapp_pids(d: Deployment) -> list[int]:
    """The ``flwr-serverapp`` processes the test's SuperLink started."""
    pids = []
    for pid in descendants(d.procs[0].pid):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(part.endswith(b"flwr-serverapp") for part in cmd[:2]):
            pids.append(pid)
    return pids


def checkpointed_round(run_dir: Path) -> int:
    latest = run_dir / "checkpoints" / "latest.json"
    if not latest.is_file():
        return 0
    name = json.loads(latest.read_text())["checkpoint"]
    return json.loads((run_dir / "checkpoints" / name).read_text())["round"]


@pytest.mark.slow
def test_killed_server_app_resumes_to_the_uninterrupted_run_on_localhost(tmp_path: Path) -> None:
    """The documented app, 5 rounds, a checkpoint every round, in a run folder
    (``fedforge-run-dir``). Its ServerApp process is SIGKILLed once round 2 is checkpointed,
    and ``flwr run`` again with ``fedforge-resume=true`` finishes the run: the model,
    ``metrics.jsonl`` (but wall seconds) and ``model.rounds.jsonl`` equal, bit for bit, the
    same run uninterrupted (in-process, the same server and client code)."""
    overrides = "rounds=5 checkpoint.every=1"
    run_dir, out = tmp_path / "run", tmp_path / "model.safetensors"
    app = copy_example(tmp_path / "app")
    toml = app / "pyproject.toml"
    toml.write_text(toml.read_text().replace('fedforge-overrides = ""',
                                             f'fedforge-overrides = "{overrides}"'))
    flags = ["--run-config", f'fedforge-run-dir="{run_dir}" fedforge-resume=true']
    d = Deployment(tmp_path, secure=False)
    try:
        for i in range(2):
            d.node(f"supernode{i}", i, 2)
        start = subprocess.run(["flwr", "run", ".", "local", *flags], cwd=app, env=d.env,
                               capture_output=True, text=True, timeout=300)
        assert start.returncode == 0, start.stdout + start.stderr
        end = time.monotonic() + 600
        while checkpointed_round(run_dir) < 2 and time.monotonic() < end:
            time.sleep(0.2)
        (pid,) = serverapp_pids(d)
        os.kill(pid, signal.SIGKILL)
        assert checkpointed_round(run_dir) < 5 and not out.exists()  # killed mid-run
        console = d.run(app, out, *flags)
    finally:
        d.close()
    assert "round 5/5" in console and "round 1/5" not in console  # resumed, not restarted
    cfg = load_config(str(EXAMPLE / "fedforge.toml"), overrides.split())
    serve(FakeGrid(client_app(cfg), 2), {
        "fedforge-config": str(EXAMPLE / "fedforge.toml"), "fedforge-overrides": overrides,
        "fedforge-out": str(tmp_path / "ref.safetensors"),
        "fedforge-run-dir": str(tmp_path / "ref")})
    want, got = load_file(tmp_path / "ref.safetensors"), load_file(out)
    assert want.keys() == got.keys() and all(torch.equal(got[k], want[k]) for k in want)

    def records(folder: Path) -> list[dict]:
        lines = (folder / "metrics.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(x).items() if k != "wall_s"} for x in lines]

    assert records(run_dir) == records(tmp_path / "ref")
    assert [r["round"] for r in records(run_dir)] == [1, 2, 3, 4, 5]
    assert rounds_of(tmp_path / "model.rounds.jsonl") == rounds_of(tmp_path / "ref.rounds.jsonl")
