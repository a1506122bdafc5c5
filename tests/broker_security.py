"""A secured Mosquitto for tests: generated PKI, password file, deploy/mosquitto config and ACL.

The broker runs the configuration shipped in deploy/mosquitto/ with only its file paths and
listener port replaced, and the ACL file exactly as shipped, so the tests check what operators
deploy. Certificates are made with cryptography.x509 into a temporary folder.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.conftest import free_port, mosquitto_binary

DEPLOY = Path(__file__).resolve().parent.parent / "deploy" / "mosquitto"
DEPLOY_CONF = DEPLOY / "mosquitto.conf"
DEPLOY_ACL = DEPLOY / "acl"

# one account per role of deploy/mosquitto/acl (a 2-mix cascade)
ROLES = ("client", "mix0", "mix1", "analyzer", "coordinator")


def mosquitto_passwd_binary() -> str | None:
    """Path of mosquitto_passwd (Debian: package mosquitto), or None."""
    return shutil.which("mosquitto_passwd") or (
        "/usr/bin/mosquitto_passwd" if os.path.exists("/usr/bin/mosquitto_passwd") else None
    )


def require_secure_broker() -> None:
    """Skip the test (fail it in CI, where SHUFFLEKIT_REQUIRE_MQTT is set) when mosquitto or
    mosquitto_passwd is missing."""
    missing = [
        name
        for name, path in (
            ("mosquitto", mosquitto_binary()),
            ("mosquitto_passwd", mosquitto_passwd_binary()),
        )
        if path is None
    ]
    if missing:
        reason = f"{' and '.join(missing)} not installed (`apt-get install mosquitto`)"
        if os.environ.get("SHUFFLEKIT_REQUIRE_MQTT"):
            pytest.fail(f"SHUFFLEKIT_REQUIRE_MQTT is set but {reason}")
        pytest.skip(reason)


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key, as PEM files."""

    cert: Path
    key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())  # fast, unlike RSA key generation


def _write(
    issued_dir: Path, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> Issued:
    cert_path, key_path = issued_dir / f"{name}.crt", issued_dir / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)
    return Issued(cert_path, key_path)


def _validity(builder: x509.CertificateBuilder) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return builder.not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(
        now + dt.timedelta(days=1)
    )


def make_ca(folder: Path, name: str) -> tuple[Issued, x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A self-signed CA that may sign leaf certificates only."""
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (
        _validity(x509.CertificateBuilder())
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _write(folder, name, cert, key), cert, key


def issue(
    folder: Path,
    name: str,
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
    *,
    server: bool,
) -> Issued:
    """A leaf certificate signed by `ca`: for the broker (127.0.0.1, localhost) or a client."""
    ca_cert, ca_key = ca
    key = _key()
    builder = (
        _validity(x509.CertificateBuilder())
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    return _write(folder, name, builder.sign(ca_key, hashes.SHA256()), key)


@dataclass(frozen=True)
class Pki:
    """The test's certificates: the broker's CA and certificate, a client's, and a foreign CA."""

    ca: Issued
    server: Issued
    client: Issued
    wrong_ca: Issued


def make_pki(folder: Path) -> Pki:
    """Generate a CA, a server certificate for 127.0.0.1/localhost, a client certificate (CN
    `client`) and an unrelated CA (to check that the broker is refused when it is trusted)."""
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_cert, ca_key = make_ca(folder, "shufflekit-test-ca")
    wrong, _, _ = make_ca(folder, "someone-elses-ca")
    return Pki(
        ca=ca,
        server=issue(folder, "server", (ca_cert, ca_key), server=True),
        client=issue(folder, "client", (ca_cert, ca_key), server=False),
        wrong_ca=wrong,
    )


def write_password_file(path: Path, accounts: dict[str, str]) -> None:
    """A Mosquitto password file for `accounts` (user -> password), hashed by mosquitto_passwd."""
    binary = mosquitto_passwd_binary()
    if binary is None:
        raise FileNotFoundError("mosquitto_passwd is not installed")
    path.write_text("".join(f"{user}:{password}\n" for user, password in accounts.items()))
    path.chmod(0o600)
    # -U hashes a plain `user:password` file in place: one process for every account
    subprocess.run([binary, "-U", str(path)], check=True, capture_output=True, timeout=30)


def render_config(
    template: str, *, port: int, service_port: int, files: dict[str, Path], state: Path
) -> str:
    """deploy/mosquitto/mosquitto.conf for a test: its own ports on loopback and file paths.

    Every setting it replaces must be present in the template as often as expected: once, or
    once per listener (a renamed or removed setting fails here rather than silently testing
    another configuration).
    """
    per_listener = 2
    replacements = {
        r"listener 8883": (f"listener {port} 127.0.0.1", 1),
        r"listener 8884": (f"listener {service_port} 127.0.0.1", 1),
        r"password_file \S+": (f"password_file {files['passwd']}", per_listener),
        r"acl_file \S+": (f"acl_file {files['acl']}", per_listener),
        r"certfile \S+": (f"certfile {files['certfile']}", per_listener),
        r"keyfile \S+": (f"keyfile {files['keyfile']}", per_listener),
        r"cafile \S+": (f"cafile {files['cafile']}", per_listener),
        r"persistence_location \S+": (f"persistence_location {state}/", 1),
    }
    out = template
    for pattern, (value, times) in replacements.items():
        out, n = re.subn(rf"(?m)^{pattern}$", value, out)
        if n != times:
            raise AssertionError(
                f"deploy/mosquitto/mosquitto.conf: expected `{pattern}` {times} time(s), not {n}"
            )
    if os.geteuid() == 0:
        # as root, mosquitto switches to the `mosquitto` user, who cannot read pytest's tmp dirs
        out += "\nuser root\n"
    return out


@dataclass(frozen=True)
class SecureBroker:
    """A running Mosquitto with the deploy/ config: its TLS URLs, PKI and role passwords.

    `port` is the clients' listener, `service_port` the services' (where the broker names each
    connection after its account)."""

    port: int
    pki: Pki
    passwords: dict[str, str]
    log: Path
    service_port: int = 0
    process: BrokerProcess | None = None  # to kill -9 and restart it

    def url(self, user: str | None = None, host: str = "127.0.0.1") -> str:
        """`mqtts://` URL of the clients' listener, with `user`'s name (not password) if given."""
        return f"mqtts://{user + '@' if user else ''}{host}:{self.port}"

    def service_url(self, user: str, host: str = "127.0.0.1") -> str:
        """`mqtts://` URL of the services' listener for account `user`."""
        return f"mqtts://{user}@{host}:{self.service_port}"


RUNNING = r"mosquitto version \S+ running"


def _wait_running(proc: subprocess.Popen[bytes], log: Path, timeout: float, seen: int = 0) -> None:
    """Wait for Mosquitto's "running" log line (printed once its listeners are open): the
    `seen` + 1st in `log` (a restart appends to the same log)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if proc.poll() is not None:
            raise RuntimeError(f"mosquitto exited ({proc.returncode}):\n{text}")
        if len(re.findall(RUNNING, text)) > seen:
            return
        time.sleep(0.02)
    raise RuntimeError(f"mosquitto did not start within {timeout} s:\n{log.read_text()}")


@dataclass
class BrokerProcess:
    """The Mosquitto process of a `SecureBroker`: a test may kill -9 it and start it again on
    the same ports, with the same configuration (and persistence folder)."""

    binary: str
    conf: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it (again) and wait until its listeners are open."""
        seen = (
            len(re.findall(RUNNING, self.log.read_text(errors="replace")))
            if self.log.exists()
            else 0
        )
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [self.binary, "-c", str(self.conf)], stdout=out, stderr=subprocess.STDOUT
            )
        _wait_running(self.proc, self.log, timeout=10.0, seen=seen)

    def kill9(self) -> None:
        """SIGKILL: nothing is written on the way out (only what an autosave wrote survives)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM (it saves its persistence file), SIGKILL if it does not exit in 10 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        self.kill9()


@contextmanager
def secure_broker(folder: Path) -> Iterator[SecureBroker]:
    """Start Mosquitto on a free loopback port with deploy/mosquitto's TLS listener and ACL.

    Raises FileNotFoundError when mosquitto or mosquitto_passwd is missing (callers skip).
    """
    binary = mosquitto_binary()
    if binary is None:
        raise FileNotFoundError("mosquitto is not installed")
    pki = make_pki(folder / "pki")
    passwords = {role: f"{role}-{os.urandom(6).hex()}" for role in ROLES}
    write_password_file(folder / "passwd", passwords)
    state = folder / "state"
    state.mkdir()
    port, service_port = free_port(), free_port()
    while service_port == port:
        service_port = free_port()
    conf = folder / "mosquitto.conf"
    conf.write_text(
        render_config(
            DEPLOY_CONF.read_text(),
            port=port,
            service_port=service_port,
            files={
                "passwd": folder / "passwd",
                "acl": DEPLOY_ACL,
                "certfile": pki.server.cert,
                "keyfile": pki.server.key,
                "cafile": pki.ca.cert,
            },
            state=state,
        )
    )
    log = folder / "mosquitto.log"
    process = BrokerProcess(binary, conf, log)
    try:
        process.start()
        yield SecureBroker(
            port=port,
            pki=pki,
            passwords=passwords,
            log=log,
            service_port=service_port,
            process=process,
        )
    finally:
        process.stop()
