"""`shufflekit loadtest --config`: the load against a deployment the run did not start (here one
started by the test as an operator would: real Mosquitto with TLS and the shipped ACL, each
service its own process, its own coordinator). Its rounds add up, its progress reads the
deployment's ledger, and a round its coordinator aborts before announcing it stops the run
with one line naming that round, instead of a wait until the time limit."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shufflekit.app.loadtest import run as loadtest_run
from shufflekit.app.loadtest import watch as loadtest_watch
from shufflekit.app.loadtest.run import LoadTestOptions, run_loadtest
from shufflekit.app.loadtest.stack import (
    LoadTestFailed,
    LocalStack,
    RssMonitor,
    build_stack,
    start_coordinator,
    start_services,
)
from shufflekit.core.transport.mqtt import ENV_CA_FILE, ENV_PASSWORD, ENV_USERNAME
from tests.broker_security import require_secure_broker

pytestmark = [pytest.mark.services, pytest.mark.mqtt, pytest.mark.slow]

USERS = 120


@pytest.fixture
def deployment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalStack]:
    """One mix, the analyzer and a ledger, serving; the client account in the environment."""
    require_secure_broker()
    folder = tmp_path / "deployment"
    folder.mkdir()
    stack = build_stack(
        folder, mixes=1, k=4, eps0=2.0, close_at=USERS, n_min=20, deadline=30.0, tls=True,
        peel_workers=1,
    )  # fmt: skip
    # the last section is [coordinator]: a hop not ready within 2 s aborts the round
    stack.config.write_text(stack.config.read_text() + "ready_timeout = 2\n")
    try:
        start_services(stack, RssMonitor())
        monkeypatch.setenv(ENV_USERNAME, "client")
        monkeypatch.setenv(ENV_PASSWORD, stack.broker.passwords["client"])
        assert stack.broker.ca is not None
        monkeypatch.setenv(ENV_CA_FILE, str(stack.broker.ca))
        monkeypatch.delenv("SHUFFLEKIT_BROKER", raising=False)
        yield stack
    finally:
        stack.stop(grace=10.0)


def _options(stack: LocalStack, rounds: int) -> LoadTestOptions:
    return LoadTestOptions(
        users=USERS, rounds=rounds, mixes=1, k=4, workers=1, connections_per_worker=2,
        config=stack.config, deadline=30.0, floor_seconds=0.1,
    )  # fmt: skip


def _coordinator_with_the_load(stack: LocalStack, rounds: int, lines: list[str]) -> object:
    """A progress callback that starts the deployment's coordinator once the load starts (after
    the run read the ledger), as an operator's would be started beside it."""

    def progress(line: str) -> None:
        lines.append(line)
        if line.startswith("starting Locust") and "coordinator" not in stack.procs:
            start_coordinator(stack, RssMonitor(), rounds)

    return progress


def test_a_config_run_adds_up_and_reads_the_rounds_from_the_ledger(
    deployment: LocalStack,
) -> None:
    lines: list[str] = []
    report = run_loadtest(
        _options(deployment, 2),
        _coordinator_with_the_load(deployment, 2, lines),  # type: ignore[arg-type]
    )
    assert report["rounds_released"] == 2, report
    assert report["reports_counted"] == report["reports_sent"] == 2 * USERS, report
    assert report["reports_lost"] == 0 and report["rounds_aborted"] == [], report
    released = [ln for ln in lines if "rounds released" in ln]
    assert released, lines
    # the count comes from the deployment's ledger (it was "?" without a stack of its own)
    assert all(not ln.startswith("?/") for ln in released), released


def test_a_round_aborted_before_its_announcement_stops_the_run_and_is_named(
    deployment: LocalStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mix 0 is down: the coordinator's one round is aborted (no hop ready) and refunded before
    any user sees it, and the coordinator ends. The users would wait for it until the run's
    time limit (here 1 x (30 + 120) + 120 s); the run ends `gone_for` after the coordinator."""
    monkeypatch.setattr(loadtest_watch, "GONE_FOR", 3.0)
    monkeypatch.setattr(loadtest_run, "LedgerWatch", _fast_watch)
    mix0 = deployment.procs["mix0"]
    mix0.terminate()
    mix0.wait(30)
    lines: list[str] = []
    with pytest.raises(LoadTestFailed) as caught:
        run_loadtest(
            _options(deployment, 1),
            _coordinator_with_the_load(deployment, 1, lines),  # type: ignore[arg-type]
        )
    message = str(caught.value)
    assert "no coordinator running for 3 s and announced only 0 of the 1 rounds" in message
    assert "not ready" in message, message  # the refund's reason, from the ledger
    assert deployment.lines("coordinator")[0]["round_id"] in message


def _fast_watch(url: str, deployment: str) -> loadtest_watch.LedgerWatch:
    """A watch that reads the ledger every half second (the run's default: every 5 s)."""
    return loadtest_watch.LedgerWatch(url, deployment, every=0.5)
