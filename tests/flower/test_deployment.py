"""A real localhost Flower deployment: SuperLink + 2 SuperNodes started as subprocesses on
127.0.0.1, ``flwr run`` of a generated app directory, 3 rounds of FedAvg through the bridge;
the final model equals the fedforge simulator's. Run twice: ``--insecure`` and TLS with a
throwaway CA made here with ``cryptography`` (no openssl CLI needed). 40-65 s each (every
ClientApp call starts a fresh ``flwr-clientapp`` process that imports torch); they run in CI
because the issue asks for a deployment test there (flwr is a test extra).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="the Flower bridge needs `pip install 'fedforge[flower]'`")
if shutil.which("flower-superlink") is None or shutil.which("flower-supernode") is None:
    pytest.skip("flower-superlink / flower-supernode not on PATH", allow_module_level=True)

from cryptography import x509  # noqa: E402  (a dependency of flwr)
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: E402
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


@pytest.mark.parametrize("mode", ["insecure", "tls"])
def test_localhost_deployment_three_rounds(tmp_path: Path, mode: str) -> None:
    """Same deployment, same checks; only the SuperLink link's transport differs by mode."""
    config = REPO / "examples" / "quickstart.toml"
    out = tmp_path / "model.safetensors"
    app = tmp_path / "app"
    app.mkdir()
    (app / "pyproject.toml").write_text(
        PYPROJECT.format(config=config, overrides=OVERRIDES, out=out))
    link = free_port()
    if mode == "tls":
        ca, cert, key = make_certs(tmp_path / "certs")
        link_flags = ["--ssl-ca-certfile", str(ca), "--ssl-certfile", str(cert),
                      "--ssl-keyfile", str(key)]
        node_flags = ["--root-certificates", str(ca)]
        connection = f'root-certificates = "{ca}"'  # flwr wants an absolute path here
    else:
        link_flags = node_flags = ["--insecure"]
        connection = "insecure = true"
    home = tmp_path / "flwr_home"
    home.mkdir()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "local"\n\n[superlink.local]\n'
        f'address = "127.0.0.1:{link}"\n{connection}\n')
    env = {**os.environ, "FLWR_HOME": str(home), "OMP_NUM_THREADS": "1"}
    logs = tmp_path / "logs"
    logs.mkdir()
    procs: list[subprocess.Popen] = []

    def start(name: str, *args: str) -> None:
        procs.append(subprocess.Popen(args, env=env, cwd=tmp_path, start_new_session=True,
                                      stdout=(logs / f"{name}.log").open("w"),
                                      stderr=subprocess.STDOUT))

    try:
        start("superlink", "flower-superlink", *link_flags, "--port", str(link),
              "--database", str(tmp_path / "state.db"))
        wait_port(link, 30)
        if mode == "tls":
            tls_handshake(link, ca)
        for i in range(2):
            start(f"supernode{i}", "flower-supernode", *node_flags,
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
