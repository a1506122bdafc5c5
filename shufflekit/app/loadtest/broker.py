"""A throwaway Mosquitto for a load test: free loopback port, TLS with a fresh CA, one account
per role, and the ACL shipped in deploy/mosquitto/ (rewritten for the cascade's length; the file
is this package's `mosquitto.acl`, which deploy/mosquitto/acl links to)."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import pwd
import re
import secrets
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from shufflekit.base.errors import ConfigError, TransportError

# the ACL deploy/mosquitto/acl links to: package data, so an installed wheel has it too
ACL = Path(__file__).with_name("mosquitto.acl")


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _binary(name: str) -> str:
    path = shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if Path(p).exists()), None
    )
    if path is None:
        raise ConfigError(
            f"{name} is not installed; install Mosquitto 2.x (`apt-get install mosquitto`) "
            "or drive an existing deployment with --config"
        )
    return path


def require_mosquitto() -> None:
    """ConfigError unless Mosquitto and mosquitto_passwd are installed (checked before a load
    test measures anything)."""
    _binary("mosquitto")
    _binary("mosquitto_passwd")


def acl_for(mixes: int, shipped: str) -> str:
    """The shipped ACL (written for 2 mixes) for a cascade of `mixes`: mix i > 0 gets mix 1's
    block with its hop numbers, the analyzer reads hop L (the file's own instructions)."""
    blocks = re.split(r"(?m)^(?=# -{10,} )", shipped)
    head = [b for b in blocks if "\nuser " not in b and not b.startswith("user")]
    by_user = {re.search(r"(?m)^user (\S+)", b).group(1): b for b in blocks if "\nuser " in b}  # type: ignore[union-attr]
    if mixes == 2:
        return shipped
    out = [*head, by_user["client"], by_user["mix0"]]
    for i in range(1, mixes):
        b = by_user["mix1"].replace("hop/2/", f"hop/{i + 1}/").replace("hop/1/", f"hop/{i}/")
        out.append(b.replace("user mix1", f"user mix{i}"))
    out.append(by_user["analyzer"].replace("hop/2/", f"hop/{mixes}/"))
    out.append(by_user["coordinator"])
    return "".join(out)


def _leaf_or_ca(
    name: str, key: ec.EllipticCurvePrivateKey, issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey]
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    b = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer[0])
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=2))
    )
    is_ca = issuer[0] == subject
    b = b.add_extension(x509.BasicConstraints(ca=is_ca, path_length=0 if is_ca else None), True)
    if not is_ca:
        san = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        b = b.add_extension(x509.SubjectAlternativeName(san), False)
    return b.sign(issuer[1], hashes.SHA256())


def _pem(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey | None) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if key is not None:
        kp = path.with_suffix(".key")
        kp.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        kp.chmod(0o600)


@dataclass
class Broker:
    """A running Mosquitto: where it listens, its CA file (TLS) and the accounts' passwords."""

    port: int
    tls: bool
    ca: Path | None
    passwords: dict[str, str]
    proc: subprocess.Popen[bytes]
    log: Path
    roles: list[str] = field(default_factory=list)

    def url(self, role: str) -> str:
        """The broker URL of `role`'s account (mqtts://user:pass@127.0.0.1:port)."""
        scheme = "mqtts" if self.tls else "mqtt"
        return f"{scheme}://{role}:{self.passwords[role]}@127.0.0.1:{self.port}"

    def stop(self) -> None:
        """Terminate the broker (and wait for it)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


PORT_ATTEMPTS = 3  # ports tried before giving up


def start_broker(folder: Path, mixes: int, *, tls: bool = True) -> Broker:
    """Mosquitto on a free loopback port with accounts and ACL; TLS unless `tls` is False."""
    binary, passwd_bin = _binary("mosquitto"), _binary("mosquitto_passwd")
    folder.mkdir(parents=True, exist_ok=True)
    roles = ["client", *(f"mix{i}" for i in range(mixes)), "analyzer", "coordinator"]
    passwords = {r: secrets.token_urlsafe(12) for r in roles}
    passwd = folder / "passwd"
    passwd.write_text("".join(f"{u}:{p}\n" for u, p in passwords.items()))
    passwd.chmod(0o600)
    subprocess.run([passwd_bin, "-U", str(passwd)], check=True, capture_output=True, timeout=30)
    acl = folder / "acl"
    acl.write_text(acl_for(mixes, ACL.read_text()))
    conf = [
        "per_listener_settings false",
        "allow_anonymous false",
        f"password_file {passwd}",
        f"acl_file {acl}",
        "persistence false",
        "max_queued_messages 1000000",
        "max_inflight_messages 1000",
        "log_dest stderr",
        "log_type error",
        "log_type warning",
        # started as root, Mosquitto switches to this user: the current one, who owns the files
        f"user {pwd.getpwuid(os.getuid()).pw_name}",
        "listener PORT 127.0.0.1",
        "protocol mqtt",
    ]
    ca_path = None
    if tls:
        ca_key, srv_key = (
            ec.generate_private_key(ec.SECP256R1()),
            ec.generate_private_key(ec.SECP256R1()),
        )
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "loadtest-ca")])
        ca = _leaf_or_ca("loadtest-ca", ca_key, (ca_name, ca_key))
        srv = _leaf_or_ca("localhost", srv_key, (ca_name, ca_key))
        ca_path = folder / "ca.crt"
        _pem(ca_path, ca, None)
        _pem(folder / "server.crt", srv, srv_key)
        conf += [
            f"certfile {folder / 'server.crt'}",
            f"keyfile {folder / 'server.key'}",
            f"cafile {ca_path}",
            "tls_version tlsv1.2",
            "require_certificate false",
        ]
    log = folder / "mosquitto.log"
    for _ in range(PORT_ATTEMPTS):  # a port found free may be taken before Mosquitto binds it
        port = free_port()
        text = "\n".join(conf).replace("listener PORT", f"listener {port}") + "\n"
        (folder / "mosquitto.conf").write_text(text)
        with log.open("wb") as out:
            proc = subprocess.Popen([binary, "-c", str(folder / "mosquitto.conf")], stderr=out)
        if _listening(proc, port):
            return Broker(port, tls, ca_path, passwords, proc, log, roles)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
            raise TransportError(f"mosquitto did not listen on port {port} within 10 s")
        if "in use" not in log.read_text():
            raise TransportError(f"mosquitto exited at start: {log.read_text()[-500:]}")
    raise TransportError(f"mosquitto found no free port in {PORT_ATTEMPTS} tries")


def _listening(proc: subprocess.Popen[bytes], port: int) -> bool:
    """Whether `proc` (Mosquitto) listens on `port`: the port answers and Mosquitto is still up
    a moment later (another listener on a port taken meanwhile answers too, while Mosquitto
    exits: "Address already in use"). False if it exits or does not listen within 10 s."""
    end = time.monotonic() + 10
    while time.monotonic() < end and proc.poll() is None:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                time.sleep(0.3)
                return proc.poll() is None
        time.sleep(0.05)
    return False
