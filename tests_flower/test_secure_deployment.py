"""The sample Flower App with security on: TLS with certificates this test makes, and
SuperNode authentication (only nodes whose public keys were registered with ``flwr
supernode register`` connect; a SuperLink with a ``--database`` keeps their ids).

The same processes as test_deployment.py's (its ``Deployment``), started secure.
"""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import subprocess
from pathlib import Path

import pytest
from test_deployment import APP, BIN, FEDERATION, HELD_OUT, ROUNDS, TRAIN, Deployment, _free_port

cryptography = pytest.importorskip("cryptography")
from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402


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


class SecureDeployment(Deployment):
    """A SuperLink with TLS, SuperNode authentication and a database; registered nodes."""

    def __enter__(self) -> SecureDeployment:
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


def test_a_run_over_tls_with_authenticated_supernodes_completes_and_strangers_are_refused(
    tmp_path: Path,
) -> None:
    with SecureDeployment(tmp_path / "secure", [*TRAIN, *HELD_OUT]) as deployment:
        make_node_key(deployment.directory, "stranger")  # never registered
        deployment.start_node("writer_02", key="stranger")
        root = tmp_path / "state"
        run = deployment.run(root)
        run.wait()
        assert run.process.returncode == 0, run.output()
        assert f"completed at round {ROUNDS} (resumed from None)" in run.output()
        # The stranger's key was never registered: it never got a node id.
        stranger = deployment.directory / "node-writer_02.log"
        assert "SuperNode ID:" not in stranger.read_text(errors="replace")
