"""Whole deployments as seeded simulations: bugs planted one at a time, each caught by the
invariant meant for it, and the deployments (twin or paused coordinators, a mix back after
its deadline) whose fixes came with a scenario."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any, ClassVar

import pytest
from typer.testing import CliRunner

from shufflekit.app.cli import app
from shufflekit.app.sim.chaos import ChaosConfig
from shufflekit.app.sim.world import SeedOutcome, SimSpec, World, run_seed
from shufflekit.shuffler.mix import MixNode


def _planted(monkeypatch: pytest.MonkeyPatch, module: Any, name: str, bug: Any) -> None:
    """Replace `module.name` by `bug(original)` for this test: a bug planted in the services."""
    monkeypatch.setattr(module, name, bug(getattr(module, name)))


def test_a_release_in_the_wrong_bins_is_caught_when_it_happens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An analyzer counting each report one value up kept every count, so no promise caught
    it (an outside audit's mutation): what a round releases is checked against what its
    clients sent, at the result."""
    import shufflekit.analyzer.service as service

    _planted(monkeypatch, service, "decode_report", lambda f: lambda *a: (f(*a) + 1) % a[2])
    out = run_seed(SimSpec(seed=0))
    v = out.violations[0]
    assert v.invariant == "released_is_what_was_sent" and "sent" in v.detail, v
    assert v.t < 30  # at the release (t = 20.05), not at the end of the seed (t > 90)


def test_a_hop_losing_a_report_is_caught_at_the_release(monkeypatch: pytest.MonkeyPatch) -> None:
    """Judged only at the end of the seed before, 70 virtual seconds after the release."""
    import shufflekit.shuffler.mix as mix

    def dropping(f: Any) -> Any:
        return lambda t, topics, rid, hop, items, *a, **kw: f(
            t, topics, rid, hop, items[:-1], *a, **kw
        )

    _planted(monkeypatch, mix, "send_batch", dropping)
    v = run_seed(SimSpec(seed=0)).violations[0]
    assert v.invariant == "receipted_counted" and v.t < 30, v


def test_a_mix_counting_a_client_twice_is_caught_by_hostile_clients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With honest clients only, mix 0 without its one-report-per-client check broke no
    promise (an outside audit's mutation): every client sent one report. Now some send a
    second, distinct one, or another's onion, and the round counts more reports than
    clients."""
    from shufflekit.shuffler.ingest import Ingest

    class Forgetful(dict[str, bytes]):
        def __contains__(self, _key: object) -> bool:
            return False  # `elif c.client_id in self.clients` never refuses

    real_init = Ingest.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        self.clients = Forgetful()

    monkeypatch.setattr(Ingest, "__init__", init)
    outs = [run_seed(SimSpec(seed=s, faults=frozenset({"hostile_clients"}))) for s in range(3)]
    found = [v for o in outs for v in o.violations]
    assert found and all(v.invariant == "receipted_counted" for v in found), found
    assert "reports from" in found[0].detail


def test_a_bug_that_only_refunds_is_caught_by_the_quiet_seeds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hop dropping its last chunk makes the next hop refuse the batch: every round is
    refunded, which broke no promise under faults. One seed in eight of a sweep runs with no
    fault, and one with only faults that lose nothing: there every round must release."""
    import shufflekit.core.batch as batch

    _planted(monkeypatch, batch, "split_chunks", lambda f: lambda *a: f(*a)[:-1])
    r = CliRunner().invoke(app, ["chaos", "--seeds", "8", "--workers", "1", "--json"])
    assert r.exit_code == 1, r.output
    broken = {(v["seed"], v["invariant"]) for v in json.loads(r.stdout)["violations"]}
    assert broken == {(3, "quiet_rounds_release"), (7, "quiet_rounds_release")}


def test_refunded_round_is_never_forwarded_when_a_broker_restart_loses_its_abort() -> None:
    """Found by seeds 157 and 297 of `shufflekit chaos --seeds 300`: mix 0's forward was lost,
    the round was aborted and refunded, then a broker restarted without persistence took the
    retained abort with it, and mix 0, resuming on reconnect, forwarded the refunded round. A
    mix now forwards only under the coordinator's go (a lease, never granted once the round is
    being refunded), so a lost abort no longer matters."""
    for seed in (157, 297):
        out = run_seed(SimSpec(seed=seed))
        assert out.faults.get("broker_restart", 0) >= 1, seed
        assert out.violations == [], (seed, out.violations)
    assert run_seed(SimSpec(seed=157, users=37)).violations == []


class Mix0BackAfterTheDeadline(World):
    """Mix 0 is killed as the round is announced and comes back after its own deadline (the
    prepared one, later than the announced one): every report the clients sent meanwhile, and
    the coordinator's close, wait in its persistent session at the broker, which delivers
    that backlog 20 unacknowledged messages at a time over a slow link (0.2 s round trips)."""

    users: ClassVar[dict[str, int]] = {}

    def _schedule_faults(self) -> None:
        self.broker.round_trip = 0.2
        asyncio.get_running_loop().call_later(1.5, self.crash, "mix0", self.spec.deadline + 12)

    def outcome(self) -> SeedOutcome:
        type(self).users = {rid: f.users for rid, f in self.checker.rounds.items()}
        return super().outcome()


def test_mix0_back_after_the_deadline_drains_its_session_before_it_closes() -> None:
    """Issue #14: mix 0 restarted after the deadline closed the round at once, from the few
    reports delivered so far, while the rest queued in its session were still arriving (it
    released 39 of 54 here: a partial batch). It now sends its own close through the broker on
    the same session and freezes the batch only when that close comes back: after the queue."""
    for seed in (0, 1, 2):
        out = run_seed(SimSpec(seed=seed, rounds=1, faults=frozenset()), Mix0BackAfterTheDeadline)
        assert out.violations == [], (seed, out.violations)
        (users,) = Mix0BackAfterTheDeadline.users.values()
        assert out.rounds_released == 1, seed
        assert out.reports_counted == users, (seed, out.reports_counted, users)


class TwinCoordinator(World):
    """An operator starts a second coordinator of the deployment while the first runs (at a
    time drawn per seed, from before the first round to the middle of the second)."""

    def _schedule_faults(self) -> None:
        at = 0.5 + self.rng.fork("twin").random() * 1.5 * self.spec.deadline
        asyncio.get_running_loop().call_later(at, self.start_twin)


def test_a_second_coordinator_exits_and_the_first_runs_every_round() -> None:
    """Two coordinators of one deployment take each other's broker session (the same client
    id) in turns, and each settles the other's round as its own leftover: in seed 1 the
    second refunded the first's second round, then its own. The second now finds the first's
    lease in the ledger and exits; the first runs the rounds asked for, and releases them."""
    spec = SimSpec(seed=0, rounds=2, faults=frozenset(), keep_trace=True)
    outs = [run_seed(dataclasses.replace(spec, seed=seed), TwinCoordinator) for seed in range(4)]
    for seed, out in enumerate(outs):
        assert out.violations == [], (seed, out.violations)
        assert (out.rounds_run, out.rounds_released) == (2, 2), seed
    for seed, out in enumerate(outs):
        twin = [e for e in out.events if e["actor"] == "coordinator-twin"]
        assert [(e["event"], e.get("error")) for e in twin] == [
            ("start", None),
            ("exited", "RoleHeld"),
        ], seed


class PausedCoordinatorFailover(World):
    """The coordinator is paused (SIGSTOP) mid-round for 25 s; 17 s in, its lease has run out
    and the operator starts another, which takes over; then the first wakes up (SIGCONT)."""

    def _schedule_faults(self) -> None:
        loop = asyncio.get_running_loop()
        loop.call_later(12.0, self.pause, "coordinator", 25.0)
        loop.call_later(29.0, self.start_twin)


def test_a_paused_coordinator_that_wakes_after_a_failover_stops() -> None:
    """The one that took over settles the rounds; the one that woke up finds its lease taken
    and stops (its supervisor restarts it, and it exits beside the running one). Every
    promise holds. (What the ledger refuses a woken coordinator that has not noticed yet is
    tested directly in tests/test_coordinator_lease.py.)"""
    spec = SimSpec(seed=0, rounds=2, faults=frozenset(), keep_trace=True)
    for seed in range(3):
        out = run_seed(dataclasses.replace(spec, seed=seed), PausedCoordinatorFailover)
        assert out.violations == [], (seed, out.violations)
        first = [e for e in out.events if e["actor"] == "coordinator"]
        woke = next(i for i, e in enumerate(first) if e["event"] == "resume")
        assert first[woke + 1]["event"] == "exited", (seed, first[woke:])
        assert first[woke + 1]["error"] == "RoleHeld", (seed, first[woke:])
        twin = [e for e in out.events if e["actor"] == "coordinator-twin"]
        assert any(e["event"] == "round" for e in twin), (seed, twin)
        assert out.rounds_released >= 1, seed


def test_a_lost_publish_of_a_hop_is_sent_again_not_refunded() -> None:
    """Found once seeds forward batches in several chunks: a chunk, manifest or ready that the
    broker did not take (no PUBACK) was never sent again, so the round waited for the
    coordinator's timeout and was refunded (21 of 48 rounds of 24 seeds of lost publishes,
    10 reports a chunk). A hop now sends a lost publish again with backoff: 48 of 48 release."""
    for seed in range(16):
        out = run_seed(SimSpec(seed=seed, faults=frozenset({"drop"}), per_chunk=10))
        assert out.violations == [], (seed, out.violations)
        assert out.faults.get("drop", 0) > 0, seed
        assert out.rounds_released == out.rounds_run == 2, seed


def test_a_mix_that_does_not_permute_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A mix forwarding in arrival order links every report to its sender, yet every count
    stays right (an audit's mutation, caught by no promise). The simulation peels each onion
    with the keys it holds and compares each forwarded batch's order with its input's."""

    class Copying:
        def shuffle(self, items: list[bytes]) -> None:
            list(items).reverse()  # the bug: permutes a copy

    real_init = MixNode.__init__

    def init(self: MixNode, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        self.rng = Copying()  # type: ignore[assignment]

    monkeypatch.setattr(MixNode, "__init__", init)
    for mixes in (1, 2):
        v = run_seed(SimSpec(seed=7, mixes=mixes, faults=frozenset())).violations[0]
        assert v.invariant == "mixes_permute" and "mix 0 forwarded" in v.detail, v


def test_a_result_published_before_its_commit_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """An analyzer publishing, then committing, broke a promise only when the commit then
    failed (not in 40 seeds of an audit): a result must never be out before its round's cost
    is committed, and that is judged at the publish."""
    import shufflekit.analyzer.service as service

    real_init = service.Analyzer.__init__

    def init(self: service.Analyzer, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        commit = self.on_release

        async def early(result: Any, seal: Any) -> Any:
            await self.transport.publish(
                self.topics.result(result.round_id), seal(result).to_bytes()
            )
            return await commit(result, seal)

        self.on_release = early

    monkeypatch.setattr(service.Analyzer, "__init__", init)
    v = run_seed(SimSpec(seed=7, faults=frozenset())).violations[0]
    assert v.invariant == "committed_before_release", v


def test_a_mix0_losing_unreceipted_reports_is_caught_by_the_quiet_seeds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Mix 0 skipping an envelope now and then (never receipted, so never owed) released
    smaller rounds and broke a promise only when one fell below n_min (seed 39 of 40 in an
    audit). Where no fault fired, every client must now be receipted and counted, as sent."""
    from shufflekit.shuffler.ingest import Ingest

    async def step(self: Any, spool: Any) -> bool:  # `after=self.last + 1`: one seq skipped
        async with self._lock:
            rid = self.job.round_id
            close = spool.close_seq(rid)
            batch = spool.messages(rid, "data", before=close, after=self.last + 1)
            if batch:
                await self._take(batch)
            return bool(batch)

    monkeypatch.setattr(Ingest, "step", step)
    v = run_seed(SimSpec(seed=7, faults=frozenset())).violations[0]
    assert v.invariant == "quiet_rounds_release" and "receipted" in v.detail, v


class CoordinatorKilledMidRound(World):
    """The coordinator is killed 5 s into its first round and started again 3 s later."""

    def _schedule_faults(self) -> None:
        asyncio.get_running_loop().call_later(5.0, self.crash, "coordinator", 3.0)


def test_round_ids_that_start_over_with_the_coordinator_are_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A coordinator numbering its rounds from 1 in each process reused a settled round's id
    after a restart: the ledger refused it, the coordinator exited again and again, and no
    promise broke (an audit's mutation). Every round asked for must now run, unless the
    budget has no room for another."""
    spec = SimSpec(seed=0, rounds=2, faults=frozenset())
    out = run_seed(spec, CoordinatorKilledMidRound)
    assert out.violations == [] and out.rounds_run == 2, out.violations

    import shufflekit.app.coordinator as coordinator

    def new_round_id(clock: Any, rng: Any = None) -> str:
        rng.planted_rounds = getattr(rng, "planted_rounds", 0) + 1  # one count per process
        return f"r{rng.planted_rounds}"

    monkeypatch.setattr(coordinator, "new_round_id", new_round_id)
    v = run_seed(spec, CoordinatorKilledMidRound).violations[0]
    assert v.invariant == "progress" and "1 of the 2 rounds" in v.detail, v


def test_a_hop_taking_a_batch_before_its_last_chunk_is_caught_by_the_lossless_seeds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hop that takes the batch once the manifest and all chunks but one are in refuses it
    (the digest does not match) when reordering lets the manifest overtake the last chunk:
    only refunds, and every batch was one chunk before (an audit's mutation). Now half the
    seeds forward several chunks, and one seed in eight has only faults that lose nothing
    (duplicates, reordering), where every round must release."""
    import shufflekit.core.batch as batch

    def scan(f: Any) -> Any:
        def early(*args: Any) -> Any:
            manifest, chunks, junk = f(*args)
            if manifest is not None and len(chunks) == manifest.chunks - 1:  # `>= chunks - 1`
                chunks = {**chunks, -1: None}
            return manifest, chunks, junk

        return early

    spec = ChaosConfig().spec(11)
    assert spec.faults == {"duplicate", "reorder"}
    assert run_seed(spec).violations == []
    _planted(monkeypatch, batch, "_scan", scan)
    v = run_seed(spec).violations[0]
    assert v.invariant == "quiet_rounds_release", v


def test_clients_that_send_their_true_value_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client agent that skips k-RR and sends its true value releases counts that add up
    all the same (an audit's mutation, caught by no promise): over a seed, the share of
    reports that kept their client's value must be k-RR's."""
    import shufflekit.app.sim.users as users
    from shufflekit.core.wire import Report

    def true_value(value: int, ann: Any, rng: Any = None) -> bytes:
        return Report(k=ann.k, value=value).encode()

    monkeypatch.setattr(users, "randomized_report", true_value)
    v = run_seed(SimSpec(seed=7, faults=frozenset())).violations[0]
    assert v.invariant == "clients_randomize", v
