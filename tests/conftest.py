"""Shared fixtures: a private Mosquitto on a free loopback port (or a restartable one for the
durability tests, `Broker`), temporary ledgers."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shufflekit.accountant.ledger import Budget, Ledger
from tests.service_procs import Procs


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def mosquitto_binary() -> str | None:
    """Path of the mosquitto broker, or None."""
    return shutil.which("mosquitto") or (
        "/usr/sbin/mosquitto" if os.path.exists("/usr/sbin/mosquitto") else None
    )


def _wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"mosquitto did not listen on {port}")


class Broker:
    """A Mosquitto on a free loopback port under `folder`, that a test can stop and start again
    on the same port (a broker restart in the middle of a round).

    With `persistence`, Mosquitto keeps its sessions, queued QoS 1 messages and retained
    messages in `folder` across a restart (it writes them when stopped with SIGTERM); without,
    each start is a fresh broker that has forgotten everything. Its log goes to
    `folder/mosquitto.log` (one file across restarts), for failed tests.
    """

    def __init__(self, folder: Path, *, persistence: bool = True) -> None:
        binary = mosquitto_binary()
        if binary is None:
            pytest.skip("mosquitto not installed")
        self.binary = binary
        self.folder = folder
        self.persistence = persistence
        self.port = free_port()
        self.url = f"mqtt://127.0.0.1:{self.port}"
        self.conf = folder / "mosquitto.conf"
        self.log = folder / "mosquitto.log"
        # Started as root, Mosquitto drops to the `mosquitto` account unless told otherwise,
        # and that account cannot write its persistence file in the test's folder: the
        # restart would then silently lose every session, queue and retained message.
        user = pwd.getpwuid(os.getuid()).pw_name
        store = (
            f"persistence true\npersistence_location {folder}/\npersistence_file mosquitto.db\n"
            if persistence
            else "persistence false\n"
        )
        self.conf.write_text(
            f"listener {self.port} 127.0.0.1\nallow_anonymous true\nuser {user}\n{store}"
            "max_queued_messages 1000000\nlog_dest stderr\nlog_type error\nlog_type warning\n"
            "log_type notice\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        """Start it (again) and wait until it listens."""
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen([self.binary, "-c", str(self.conf)], stderr=log)
        self.starts += 1
        _wait_port(self.port)

    def stop(self) -> None:
        """SIGTERM: with persistence, Mosquitto first writes its sessions, queues and retained
        messages; the test fails if that write failed (the restart would prove nothing)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        if self.persistence:
            assert (self.folder / "mosquitto.db").is_file(), self.log.read_text()

    def restart(self) -> None:
        """Stop, then start on the same port."""
        self.stop()
        self.start()

    def kill(self) -> None:
        """SIGKILL if running (teardown)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="session")
def mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a Mosquitto broker started for this test session on a free loopback port."""
    binary = mosquitto_binary()
    if binary is None:
        if os.environ.get("SHUFFLEKIT_REQUIRE_MQTT"):
            pytest.fail("mosquitto is required here (SHUFFLEKIT_REQUIRE_MQTT is set) but absent")
        pytest.skip("mosquitto not installed: `apt-get install mosquitto` to run the MQTT tests")
    port = free_port()
    d = tmp_path_factory.mktemp("mosquitto")
    conf = d / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
        "max_queued_messages 0\nmax_inflight_messages 0\n"
    )
    proc = subprocess.Popen(
        [binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        _wait_port(port)
        yield f"mqtt://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def ledger(ledger_url: str) -> Ledger:
    """A fresh ledger (each backend) with a budget for deployment `test` (n_min 10, epsilon 10;
    the eps0 sum, adaptive: any round type in any order)."""
    led = Ledger(ledger_url)
    led.init_budget(
        Budget(
            "test",
            epsilon_total=10.0,
            delta_total=1e-6,
            n_min=10,
            cost_model="ldp",
            mode="adaptive",
        )
    )
    return led


PG_ADMIN_URL = os.environ.get(
    "SHUFFLEKIT_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


def _pg_admin() -> object | None:
    import sqlalchemy as sa

    try:
        engine = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with engine.connect() as c:
            c.execute(sa.text("select 1"))
        return engine
    except Exception:
        return None


@pytest.fixture(scope="session")
def pg_server() -> object:
    """An admin engine on the PostgreSQL server at 127.0.0.1:5432, or skip with the reason."""
    engine = _pg_admin()
    if engine is None:
        pytest.skip(f"no PostgreSQL answers at {PG_ADMIN_URL} (set SHUFFLEKIT_TEST_PG)")
    return engine


@pytest.fixture
def pg_url(pg_server: object) -> Iterator[str]:
    """URL of a fresh, empty PostgreSQL database, dropped after the test."""
    import uuid

    import sqlalchemy as sa

    engine = pg_server
    assert isinstance(engine, sa.Engine)
    name = f"sk_test_{uuid.uuid4().hex[:12]}"
    with engine.connect() as c:
        c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = engine.url.set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        with engine.connect() as c:
            c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(params=["sqlite", "postgres"])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh ledger URL on each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    """Child processes of the test (tests/service_procs.py), killed at teardown whatever the
    test did."""
    p = Procs(tmp_path)
    try:
        yield p
    finally:
        p.kill_all()
