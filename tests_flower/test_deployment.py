"""The sample Flower App (samples/flower_app) on Flower's real processes.

A SuperLink and SuperNodes on 127.0.0.1 (free ports), started by the tests, and
``flwr run`` as a user runs it. Each deployment has a directory of its own: its
``FLWR_HOME`` (``flwr run`` writes ``config.toml`` there), a copy of the app (``flwr
run`` comments out the copy's ``[tool.flwr.federations]``), the processes' logs and the
state roots. Every process starts in a session of its own, and teardown kills its whole
process group (its SuperExec, ServerApp and ClientApp processes are its children).

Security on, as a federation over a network runs: TLS with certificates the tests make,
SuperNode authentication (each node's key registered with ``flwr supernode register``; a
node whose key was not registered gets no node id) and a SuperLink database. The docs'
Flower how-to runs the insecure mode.

The final weights are compared with the same program (``flower_app.program.train``) on
``LocalContext``: clients train one a group there as on the nodes, so they are equal
exactly. Each test prints what it measured (``pytest -s``): the time from ``flwr run``
to the first round's checkpoint and the median round time.
"""

from __future__ import annotations

import csv
import datetime
import ipaddress
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

REPO = Path(__file__).resolve().parents[1]
APP = REPO / "samples" / "flower_app"
BIN = Path(sys.executable).parent
FEDERATION = "tests"
SERVERAPP = "flwr-serverapp"

for tool in ("flower-superlink", "flower-supernode", "flwr", SERVERAPP):
    if not (BIN / tool).exists():
        pytest.skip(f"{tool} is not in {BIN}: install the flower extra", allow_module_level=True)

sys.path.insert(0, str(APP))  # the app's package, as the ServerApp imports it
from flower_app.program import Settings, train  # noqa: E402

from programlogic import LocalContext, final_model_key  # noqa: E402
from programlogic.data import InMemoryDataSource  # noqa: E402
from programlogic.datasets import load_digits_writers  # noqa: E402

ROUNDS = 4
TRAIN = ("writer_00", "writer_01")
HELD_OUT = ("writer_10",)
CONFIG: dict[str, Any] = {
    "train-clients": ",".join(TRAIN),
    "eval-clients": ",".join(HELD_OUT),
    "rounds": ROUNDS,
    "clients-per-round": len(TRAIN),
    "eval-every": 2,
    "seed": 0,
}
RUN_TIMEOUT = 300.0  # seconds a `flwr run` may take; a hung run fails its test


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _toml(config: Mapping[str, Any]) -> str:
    """``config`` as TOML lines (str, int, float and bool values: a run config's kinds)."""
    return "".join(f"{key} = {json.dumps(value)}\n" for key, value in config.items())


class Run:
    """One ``flwr run --stream`` and the checkpoints its ServerApp writes under ``root``."""

    def __init__(self, process: subprocess.Popen[bytes], log: Path, root: Path) -> None:
        self.process = process
        self.log = log
        self.root = root
        self.started = time.monotonic()
        self.seen: dict[int, float] = {}  # checkpoint version: seconds after the start

    def _look(self) -> None:
        for path in (self.root / "state").glob("program_state_*.plstate"):
            version = int(path.stem.rpartition("_")[2])
            self.seen.setdefault(version, time.monotonic() - self.started)

    def wait(self, *, version: int | None = None, timeout: float = RUN_TIMEOUT) -> None:
        """Until the run ends (or checkpoint ``version`` appears), watching checkpoints."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self._look()
            if version is not None and version in self.seen:
                return
            if version is None and self.process.poll() is not None:
                return
            if self.process.poll() is not None:
                pytest.fail(f"flwr run ended before checkpoint {version}:\n{self.output()}")
            time.sleep(0.1)
        pytest.fail(f"flwr run took over {timeout:.0f} s:\n{self.output()}")

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]

    def timings(self) -> str:
        first = self.seen.get(1)
        rounds = [
            self.seen[v] - self.seen[v - 1]
            for v in sorted(self.seen)
            if v >= 2 and v - 1 in self.seen
        ]
        median = f"{statistics.median(rounds):.1f} s" if rounds else "n/a"
        start = f"{first:.1f} s" if first is not None else "n/a"
        return f"flwr run to round 1's checkpoint {start}; median round {median} ({len(rounds)})"


def _pem_key(key: ec.EllipticCurvePrivateKey, form: serialization.PrivateFormat) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, form, serialization.NoEncryption())


def make_certificates(directory: Path) -> None:
    """A CA, and a server certificate for 127.0.0.1 it signs: ca.crt, server.pem, server.key."""
    now = datetime.datetime.now(datetime.UTC)
    valid = {
        "not_valid_before": now - datetime.timedelta(minutes=5),
        "not_valid_after": now + datetime.timedelta(days=1),
    }
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "programlogic test CA")])
    ca = (
        x509.CertificateBuilder(subject_name=ca_name, issuer_name=ca_name, **valid)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP384R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    server = (
        x509.CertificateBuilder(subject_name=subject, issuer_name=ca_name, **valid)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (directory / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (directory / "server.pem").write_bytes(server.public_bytes(serialization.Encoding.PEM))
    (directory / "server.key").write_bytes(_pem_key(key, serialization.PrivateFormat.PKCS8))


def make_node_key(directory: Path, name: str) -> tuple[Path, Path]:
    """An EC key pair in OpenSSH form, as ``ssh-keygen -t ecdsa -b 384`` writes it."""
    key = ec.generate_private_key(ec.SECP384R1())
    private, public = directory / f"{name}.key", directory / f"{name}.pub"
    private.write_bytes(_pem_key(key, serialization.PrivateFormat.OpenSSH))
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
    )
    return private, public


class Deployment:
    """A SuperLink (TLS, SuperNode authentication, a database) and one registered
    SuperNode per client id, in ``directory``."""

    def __init__(self, directory: Path, client_ids: Sequence[str]) -> None:
        self.directory = directory
        self.client_ids = list(client_ids)
        self.home = directory / "flwr_home"
        self.app = directory / "app"
        self.port = _free_port()
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.runs = 0

    def env(self) -> dict[str, str]:
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
        return {
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",  # flower-superexec
            "PYTHONPATH": path,  # this checkout's programlogic in every Flower process
            "FLWR_HOME": str(self.home),
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.2",  # default 1 s
            "TF_CPP_MIN_LOG_LEVEL": "3",
        }

    def _spawn(self, name: str, args: Sequence[str]) -> subprocess.Popen[bytes]:
        log = (self.directory / f"{name}.log").open("ab")
        process = subprocess.Popen(
            [str(BIN / args[0]), *args[1:]],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env(),
            cwd=self.directory,
            start_new_session=True,
        )
        log.close()
        self.processes[name] = process
        return process

    def __enter__(self) -> Deployment:
        self.home.mkdir(parents=True)
        make_certificates(self.directory)
        shutil.copytree(APP, self.app, ignore=shutil.ignore_patterns("__pycache__"))
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{FEDERATION}"\n\n[superlink.{FEDERATION}]\n'
            f'address = "127.0.0.1:{self.port}"\n'
            f'root-certificates = "{self.directory / "ca.crt"}"\n'
        )
        try:
            self._spawn(
                "superlink",
                [
                    "flower-superlink",
                    "--ssl-ca-certfile",
                    str(self.directory / "ca.crt"),
                    "--ssl-certfile",
                    str(self.directory / "server.pem"),
                    "--ssl-keyfile",
                    str(self.directory / "server.key"),
                    "--enable-supernode-auth",
                    "--database",
                    str(self.directory / "superlink.db"),
                    "--disable-runtime-dependency-installation",
                    "--port",
                    str(self.port),
                ],
            )
            self._wait_for_port(self.port)
            for client_id in self.client_ids:
                _, public = make_node_key(self.directory, client_id)
                self.register(public, client_id)
                self.start_node(client_id)
            for client_id in self.client_ids:
                self.wait_for_node(client_id)
        except BaseException:
            self.close()
            raise
        return self

    def register(self, public: Path, name: str) -> str:
        registered = subprocess.run(
            [str(BIN / "flwr"), "supernode", "register", str(public), FEDERATION, "--name", name],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert registered.returncode == 0, registered.stdout + registered.stderr
        return registered.stdout

    def start_node(self, client_id: str, key: str | None = None) -> None:
        self._spawn(
            f"node-{client_id}",
            [
                "flower-supernode",
                "--root-certificates",
                str(self.directory / "ca.crt"),
                "--auth-supernode-private-key",
                str(self.directory / f"{key or client_id}.key"),
                "--superlink",
                f"127.0.0.1:{self.port}",
                "--node-config",
                f'client-id="{client_id}"',
                "--port",
                str(_free_port()),
                "--max-retries",
                "3",
            ],
        )

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _wait_for_port(self, port: int, timeout: float = 60.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.2)
        pytest.fail(f"nothing listens on port {port} after {timeout:.0f} s")

    def wait_for_node(self, client_id: str, timeout: float = 60.0) -> None:
        """Until the SuperNode has registered (its log names its node id)."""
        log = self.directory / f"node-{client_id}.log"
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if "SuperNode ID:" in log.read_text(errors="replace"):
                return
            if self.processes[f"node-{client_id}"].poll() is not None:
                break
            time.sleep(0.2)
        pytest.fail(f"the SuperNode of {client_id} did not register:\n{log.read_text()[-3000:]}")

    def kill(self, name: str) -> None:
        """SIGKILL a process and its children (its process group)."""
        process = self.processes.pop(name)
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(timeout=10)

    def run(self, root: Path, **overrides: Any) -> Run:
        """``flwr run`` the app with the run config ``CONFIG``, ``root`` and ``overrides``."""
        self.runs += 1
        config = self.directory / f"run-config-{self.runs}.toml"
        config.write_text(_toml({**CONFIG, "root": str(root), **overrides}))
        name = f"flwr-run-{self.runs}"
        process = self._spawn(
            name,
            ["flwr", "run", str(self.app), FEDERATION, "--run-config", str(config), "--stream"],
        )
        return Run(process, self.directory / f"{name}.log", root)

    def serverapps(self) -> list[int]:
        """The pids of this deployment's ServerApp processes (those with its FLWR_HOME)."""
        pids = []
        marker = f"FLWR_HOME={self.home}".encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                command = (entry / "cmdline").read_bytes()
                if SERVERAPP.encode() in command and marker in (
                    (entry / "environ").read_bytes().split(b"\0")
                ):
                    pids.append(int(entry.name))
            except OSError:
                continue
        return pids

    def close(self) -> None:
        for process in self.processes.values():
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for process in self.processes.values():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(process.pid, signal.SIGKILL)  # what SIGTERM left, children too
            except ProcessLookupError:
                pass
            process.wait(timeout=10)
        self.processes.clear()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """Two training writers' SuperNodes and a held-out writer's, TLS and authentication on."""
    directory = tmp_path_factory.mktemp("deployment")
    with Deployment(directory, [*TRAIN, *HELD_OUT]) as federation:
        yield federation


def _final_weights(root: Path, rounds: int = ROUNDS) -> list[np.ndarray]:
    import programlogic
    from managers import ModelFileReleaseManager

    weights = programlogic.run(
        ModelFileReleaseManager(root / "models").load(final_model_key(rounds))
    )
    return _leaves(weights)


def _leaves(weights: Any) -> list[np.ndarray]:
    import tensorflow as tf

    return [np.asarray(leaf) for leaf in tf.nest.flatten(weights)]


@pytest.fixture(scope="module")
def local_weights(tmp_path_factory: pytest.TempPathFactory) -> list[np.ndarray]:
    """The final weights of the same program on LocalContext, the writers' data here."""
    import programlogic

    digits = load_digits_writers()
    root = tmp_path_factory.mktemp("local")
    settings = Settings.from_run_config({**CONFIG, "root": str(root)})

    def source(ids: Sequence[str], split: Any) -> InMemoryDataSource:
        handles = [handle for handle in split.all_clients() if handle.client_id in ids]
        return InMemoryDataSource({handle.client_id: handle.load() for handle in handles})

    async def main() -> None:
        async with LocalContext(max_workers=2):
            await train(settings, source(TRAIN, digits.train), source(HELD_OUT, digits.test))

    programlogic.run(main())
    return _final_weights(root)


def _assert_equal_weights(ours: list[np.ndarray], local: list[np.ndarray]) -> None:
    assert [a.shape for a in ours] == [b.shape for b in local]
    difference = max(float(np.max(np.abs(a - b))) for a, b in zip(ours, local, strict=True))
    assert difference == 0.0, f"the weights differ from LocalContext's by up to {difference}"


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as file:
        return list(csv.DictReader(file))


def test_a_run_over_tls_on_authenticated_supernodes_gives_its_files_and_local_weights(
    deployment: Deployment, local_weights: list[np.ndarray], tmp_path: Path
) -> None:
    make_node_key(deployment.directory, "stranger")  # never registered
    deployment.start_node("writer_02", key="stranger")
    root = tmp_path / "state"
    run = deployment.run(root)
    run.wait()
    assert run.process.returncode == 0, run.output()
    assert f"completed at round {ROUNDS} (resumed from None)" in run.output()
    stranger = deployment.directory / "node-writer_02.log"
    assert "SuperNode ID:" not in stranger.read_text(errors="replace")
    print(f"\nuninterrupted, {len(TRAIN)} clients a round: {run.timings()}")

    assert [row["key"] for row in _rows(root / "metrics.csv")] == [
        str(r) for r in range(1, ROUNDS + 1)
    ]
    metrics = _rows(root / "metrics.csv")
    assert {row["client_work/train/num_examples"] for row in metrics} == {"1280"}
    assert [row["key"] for row in _rows(root / "evaluation.csv")] == ["0", "2", "4"]
    assert f"the model: {root / 'model' / str(ROUNDS) / 'model.keras'}" in run.output()
    assert (root / "model" / str(ROUNDS) / "model.keras").is_file()
    _assert_equal_weights(_final_weights(root), local_weights)

    again = deployment.run(root)  # a finished run: the rerun finds it done
    again.wait()
    assert again.process.returncode == 0, again.output()
    assert f"completed at round {ROUNDS} (resumed from {ROUNDS})" in again.output()
    assert _rows(root / "metrics.csv") == metrics


@pytest.mark.xfail(
    reason="after the SIGKILL the training nodes stay busy with the dead run's last "
    "ClientApp (one node answered 8.5 s later, the other not within 100 s; the run is "
    "marked failed after ~98 s), so the rerun's handshake (10 s) misses them and round "
    "3 fails with ClientError 'no node of client ... is connected'",
    strict=True,
)
def test_a_serverapp_killed_mid_run_resumes_to_the_uninterrupted_weights(
    deployment: Deployment, local_weights: list[np.ndarray], tmp_path: Path
) -> None:
    root = tmp_path / "state"
    killed_after = 2
    first = deployment.run(root)
    first.wait(version=killed_after)
    pids = deployment.serverapps()
    assert len(pids) == 1, f"expected one {SERVERAPP} process, found {pids}"
    os.kill(pids[0], signal.SIGKILL)
    # The stream goes on while the SuperLink lists the dead run as running (~55 s).
    deployment.kill(f"flwr-run-{deployment.runs}")
    assert not (root / "models" / f"{final_model_key(ROUNDS)}.model").exists()
    print(f"\nkilled after round {killed_after}: {first.timings()}")

    second = deployment.run(root)
    second.wait()
    assert second.process.returncode == 0, second.output()
    (line,) = [line for line in second.output().splitlines() if "completed at round" in line]
    resumed_from = int(line.split("resumed from ")[1].split(")")[0])
    assert killed_after <= resumed_from < ROUNDS, line
    print(f"rerun resumed from round {resumed_from}: {second.timings()}")

    keys = [row["key"] for row in _rows(root / "metrics.csv")]
    assert keys == [str(r) for r in range(1, ROUNDS + 1)]
    _assert_equal_weights(_final_weights(root), local_weights)
