"""Keys, service configuration and the readiness/shutdown rules of the services, in-process."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shufflekit.accountant.ledger import Budget, Ledger
from shufflekit.analyzer.service import Analyzer
from shufflekit.app.cli import app
from shufflekit.app.coordinator import Coordinator
from shufflekit.app.hops import HopRunner
from shufflekit.app.rounds import COORDINATOR_HOP, RoundParams, ledger_release_hook
from shufflekit.app.services.config import load_config
from shufflekit.app.services.keys import load_private_key, load_public_key
from shufflekit.app.services.runtime import with_reconnect
from shufflekit.base.errors import BrokerAuthError, ConfigError, TransportError
from shufflekit.client.agent import build_envelope
from shufflekit.core.crypto import KeyPair
from shufflekit.core.messages import Announcement
from shufflekit.core.spool import Spool
from shufflekit.core.topics import Topics
from shufflekit.core.transport import MemoryBroker
from shufflekit.shuffler.mix import MixNode

runner = CliRunner()


def test_keys_new_writes_a_private_0600_and_a_public_file(tmp_path: Path) -> None:
    res = runner.invoke(
        app, ["keys", "new", "--role", "mix", "--index", "1", "--out", str(tmp_path), "--json"]
    )
    assert res.exit_code == 0, res.output
    info = json.loads(res.stdout)
    priv, pub = Path(info["private_key_file"]), Path(info["public_key_file"])
    assert (priv.name, pub.name) == ("mix1.key", "mix1.pub")
    assert stat.S_IMODE(priv.stat().st_mode) == 0o600
    assert load_public_key(pub) == info["public_key"] == load_private_key(priv).public_b64()

    again = runner.invoke(
        app, ["keys", "new", "--role", "mix", "--index", "1", "--out", str(tmp_path)]
    )
    assert again.exit_code == 2 and "--force" in again.output
    assert load_public_key(pub) == info["public_key"]  # untouched
    forced = runner.invoke(
        app,
        [
            "keys",
            "new",
            "--role",
            "mix",
            "--index",
            "1",
            "--out",
            str(tmp_path),
            "--force",
            "--json",
        ],
    )
    assert forced.exit_code == 0 and json.loads(forced.stdout)["public_key"] != info["public_key"]
    assert stat.S_IMODE(priv.stat().st_mode) == 0o600

    for bad in (
        ["--role", "mix"],
        ["--role", "coordinator"],
        ["--role", "analyzer", "--index", "0"],
    ):
        r = runner.invoke(app, ["keys", "new", *bad, "--out", str(tmp_path)])
        assert r.exit_code == 2, bad


@pytest.mark.parametrize(
    ("role", "derived"),
    [(["--role", "mix", "--index", "0"], "mix0.receipt.pub"),
     (["--role", "analyzer"], "analyzer.result.pub"),
     (["--role", "mix", "--index", "1"], None)],
)  # fmt: skip
def test_keys_new_names_every_file_it_writes(
    tmp_path: Path, role: list[str], derived: str | None
) -> None:
    """`keys new --role mix --index 0` (and `--role analyzer`) also writes the public half of
    the key it derives (mix0.receipt.pub, analyzer.result.pub) but said so nowhere, neither in
    its text, its JSON nor its help: an operator copying the printed files left one behind."""
    res = runner.invoke(app, ["keys", "new", *role, "--out", str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.stdout)
    want = [str(tmp_path / derived)] if derived else []
    assert info["derived_public_key_files"] == want
    assert all(Path(f).is_file() for f in want)
    text = runner.invoke(app, ["keys", "new", *role, "--out", str(tmp_path / "t")])
    assert text.exit_code == 0, text.output
    assert (derived is None) or f"{tmp_path / 't' / derived}" in text.output, text.output
    assert "receipt" in runner.invoke(app, ["keys", "new", "--help"]).output


def test_a_private_key_readable_by_others_is_refused(tmp_path: Path) -> None:
    runner.invoke(app, ["keys", "new", "--role", "analyzer", "--out", str(tmp_path)])
    key = tmp_path / "analyzer.key"
    os.chmod(key, 0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        load_private_key(key)
    os.chmod(key, 0o600)
    key.write_text("not base64!\n")
    with pytest.raises(ConfigError, match="not a shufflekit key file"):
        load_private_key(key)


GOOD = """
broker = "mqtt://127.0.0.1:1883"
deployment = "pilot"
mixes = 2
keys_dir = "keys"
state_dir = "state"

[mix]
batch_timeout = 10

[coordinator]
k = 4
eps0 = 1.5
deadline = 30
"""


def test_config_resolves_paths_and_takes_environment_overrides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = tmp_path / "conf" / "sk.toml"
    f.parent.mkdir()
    f.write_text(GOOD)
    monkeypatch.setenv("SHUFFLEKIT_COORDINATOR__N_MIN", "77")
    monkeypatch.setenv("SHUFFLEKIT_BROKER", "mqtt://127.0.0.1:1999")
    monkeypatch.setenv("SHUFFLEKIT_STATE", "/elsewhere")  # another setting's variable: ignored
    monkeypatch.setenv("SHUFFLEKIT_MIX__SPOOL_ROUND_BYTES", "65536")
    cfg = load_config(f)
    # mix 0's spool bounds (deploy/README.md): the round's from the environment, the default
    assert (cfg.mix.spool_round_bytes, cfg.mix.spool_total_bytes) == (65536, 4 << 30)
    c = cfg.coordinator_settings()
    assert (cfg.broker, c.n_min, c.k, cfg.mix.batch_timeout) == ("mqtt://127.0.0.1:1999", 77, 4, 10)
    assert cfg.mix_private_key(1) == tmp_path / "conf" / "keys" / "mix1.key"
    assert cfg.public_keys() == (
        [tmp_path / "conf" / "keys" / "mix0.pub", tmp_path / "conf" / "keys" / "mix1.pub"],
        tmp_path / "conf" / "keys" / "analyzer.pub",
    )
    assert cfg.ledger_url() == f"sqlite:///{tmp_path / 'conf' / 'state' / 'ledger.db'}"
    assert cfg.mix_index(1) == 1
    with pytest.raises(ConfigError, match="outside the cascade of 2"):
        cfg.mix_index(2)
    with pytest.raises(ConfigError, match="--index"):
        cfg.mix_index(None)


def test_a_service_without_its_ledger_or_budget_gives_a_hint_to_paste(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a docs audit: a service whose ledger was missing hinted `shufflekit budget init
    --epsilon E --delta D`, which, pasted, made the default ledger's budget of 'default', not
    the service's; one whose budget was missing left out the required --epsilon and --delta."""
    import shlex

    from shufflekit.app.services.runtime import open_ledger
    from shufflekit.base.errors import LedgerError

    f = tmp_path / "conf" / "sk.toml"
    f.parent.mkdir()
    f.write_text(GOOD)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SHUFFLEKIT_STATE", str(tmp_path / "default-state"))
    cfg = load_config(f)

    def paste(exc: pytest.ExceptionInfo[Exception]) -> None:
        hint = str(exc.value).split("`")[1].replace(" E ", " 5 ").replace(" D", " 1e-6")
        words = shlex.split(hint)
        assert words[:3] == ["shufflekit", "budget", "init"], hint
        res = runner.invoke(app, words[1:])
        assert res.exit_code == 0, res.output

    Path(tmp_path / "conf" / "state").mkdir()
    Ledger(cfg.ledger_url()).close()  # a ledger without the deployment's budget
    with pytest.raises(ConfigError, match="has no budget for deployment 'pilot'") as no_budget:
        open_ledger(cfg)
    paste(no_budget)
    open_ledger(cfg).close()
    (tmp_path / "conf" / "state" / "ledger.db").unlink()
    with pytest.raises(LedgerError, match="no ledger at") as no_ledger:
        open_ledger(cfg)
    paste(no_ledger)
    open_ledger(cfg).close()
    assert not (tmp_path / "default-state").exists()


def test_absolute_key_paths_are_used_as_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An absolute key path was replaced by the default (deploy/examples/mix.toml could not
    work, and an absolute enrollment_key turned credential checks off without an error)."""
    f = tmp_path / "conf" / "sk.toml"
    f.parent.mkdir()
    keys = tmp_path / "etc"
    f.write_text(
        GOOD.replace("[mix]\n", f'[mix]\nprivate_key = "{keys / "mix1.key"}"\n')
        + f'analyzer_public_key = "{keys / "analyzer.pub"}"\n'
        + f'\n[analyzer]\nprivate_key = "{keys / "analyzer.key"}"\n'
    )
    monkeypatch.setenv("SHUFFLEKIT_MIX__ENROLLMENT_KEY", str(keys / "enrollment.pub"))
    cfg = load_config(f)
    assert cfg.mix_private_key(1) == keys / "mix1.key"
    assert cfg.mix.enrollment_key == keys / "enrollment.pub"
    assert cfg.analyzer_private_key() == keys / "analyzer.key"
    assert cfg.public_keys()[1] == keys / "analyzer.pub"


def test_config_errors_name_every_bad_field(tmp_path: Path) -> None:
    f = tmp_path / "bad.toml"
    f.write_text(
        'broker = "http://x"\ndeployment = "a b"\nmixes = 0\nsurprise = 1\n'
        '[coordinator]\nk = 1\n[analyzer]\nestimator = "magic"\n'
    )
    with pytest.raises(ConfigError) as err:
        load_config(f)
    msg = str(err.value)
    for line in (
        "broker: ",
        "deployment: ",
        "mixes: Input should be greater than or equal to 1 (got 0)",
        "coordinator.k: ",
        "coordinator.eps0: Field required",
        "analyzer.estimator: unknown estimator 'magic'",
        "surprise: unknown setting",
    ):
        assert line in msg, (line, msg)
    f.write_text("broker = [")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(f)
    with pytest.raises(ConfigError, match="cannot read configuration"):
        load_config(tmp_path / "missing.toml")
    f.write_text(GOOD.split("[coordinator]")[0])
    with pytest.raises(ConfigError, match=r"no \[coordinator\] section"):
        load_config(f).coordinator_settings()


def test_a_bad_configuration_is_one_readable_line_on_the_command_line(tmp_path: Path) -> None:
    """`serve` with a bad file printed every problem on one line glued by runs of spaces
    ("...environment):   mixes: Field required   surprise: unknown setting ..."): the
    problems are now separated by "; ", one line as every error of the CLI."""
    f = tmp_path / "bad.toml"
    f.write_text('broker = "mqtt://127.0.0.1:1"\ndeployment = "x"\nsurprise = 1\n')
    r = CliRunner().invoke(app, ["serve", "mix", "--index", "0", "--config", str(f)])
    assert r.exit_code == 2
    lines = r.output.strip().splitlines()
    assert len(lines) == 1, r.output
    assert f"invalid configuration {f} (or SHUFFLEKIT_* environment): " in lines[0]
    assert "mixes: Field required; surprise: unknown setting" in lines[0], lines[0]
    assert "  " not in lines[0], lines[0]


def _ledger(tmp_path: Path) -> Ledger:
    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    led.init_budget(Budget("test", 10.0, 1e-6, n_min=10, cost_model="ldp"))
    return led


async def test_a_hop_that_is_not_ready_aborts_before_any_client_is_asked(tmp_path: Path) -> None:
    led = _ledger(tmp_path)
    broker = MemoryBroker()
    key = KeyPair.generate()
    async with (
        broker.connect() as m0,
        broker.connect() as coord_conn,
        broker.connect() as spy,
        spy.subscribe("shufflekit/test/announce") as announced,
    ):
        stop = asyncio.Event()
        mix0 = asyncio.create_task(HopRunner(MixNode(m0, "test", 0, key), m0, "test").serve(stop))
        coord = Coordinator(
            coord_conn,
            "test",
            led,
            [key.public_b64()],
            KeyPair.generate().public_b64(),  # nobody serves the analyzer
            ready_timeout=1.5,
        )
        rep = await coord.run_round(RoundParams(k=4, eps0=1.0, n_min=10))
        stop.set()
        await asyncio.wait_for(mix0, 5)
        assert announced._queue.empty()  # no announcement ever reached clients
    assert not rep.released and rep.abort is not None
    assert rep.abort.hop == COORDINATOR_HOP and "[1] not ready" in rep.abort.reason
    assert [r.status for r in led.status("test").rounds] == ["refunded"]


async def test_a_coordinator_stopped_while_waiting_for_hops_says_so(tmp_path: Path) -> None:
    """SIGTERM during the ready handshake was reported as "hop(s) [0] not ready within 30s"."""
    led = _ledger(tmp_path)
    async with MemoryBroker().connect() as coord_conn:
        coord = Coordinator(
            coord_conn,
            "test",
            led,
            [KeyPair.generate().public_b64()],  # no hop serves: none will be ready
            KeyPair.generate().public_b64(),
            ready_timeout=30,
        )
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.3, stop.set)
        rep = await asyncio.wait_for(
            coord.run_round(RoundParams(k=4, eps0=1.0, n_min=10), stop=stop), 10
        )
    assert rep.abort is not None and "shutting down" in rep.abort.reason
    assert "not ready" not in rep.abort.reason
    assert [r.status for r in led.status("test").rounds] == ["refunded"]


async def test_a_mix_stopped_while_collecting_keeps_the_round_for_its_next_start(
    tmp_path: Path,
) -> None:
    """SIGTERM to mix 0 during ingest (`systemctl restart`) aborted the round and threw its
    receipted reports away, where kill -9 kept them: now a stop leaves the round in the spool,
    no abort goes out, and the restarted mix releases every report it had."""
    led = _ledger(tmp_path)
    broker = MemoryBroker()
    key, analyzer_key = KeyPair.generate(), KeyPair.generate()
    disk = Spool(tmp_path / "spool-mix0.db")  # what survives the restart
    users = 20
    async with (
        broker.connect() as m0,
        broker.connect() as coord_conn,
        broker.connect() as an,
        broker.connect() as clients,
        broker.connect() as spy,
        spy.subscribe("shufflekit/test/round/+/abort") as aborts,
    ):
        stop, subscribed = asyncio.Event(), asyncio.Event()
        first = asyncio.create_task(
            HopRunner(MixNode(m0, "test", 0, key, spool=disk), m0, "test").serve(
                stop, subscribed=subscribed
            )
        )
        await subscribed.wait()
        restart_stop = asyncio.Event()
        restarted: list[asyncio.Task[None]] = []

        async def send_then_restart_mix(ann: Announcement) -> int:
            topic = Topics("test").data(ann.round_id, 0)
            for i in range(users):
                await clients.publish(topic, build_envelope(f"c{i}", i % 4, ann))
            for _ in range(200):  # until mix 0 spooled them all (receipted, in production)
                if len(disk.messages(ann.round_id, "data")) == users:
                    break
                await asyncio.sleep(0.02)
            stop.set()  # SIGTERM to mix 0 while the round is open
            await asyncio.wait_for(first, 5)
            assert aborts._queue.empty()  # nothing was aborted
            assert [r.round_id for r in disk.unfinished()] == [ann.round_id]
            runner = HopRunner(MixNode(m0, "test", 0, key, spool=disk), m0, "test")
            back = asyncio.Event()  # (a broker keeps a stopped service's messages for it)
            restarted.append(asyncio.create_task(runner.serve(restart_stop, subscribed=back)))
            await back.wait()
            return users

        an_stop = asyncio.Event()
        analyzer = asyncio.create_task(
            HopRunner(
                Analyzer(an, "test", analyzer_key, on_release=ledger_release_hook(led, "test")),
                an,
                "test",
            ).serve(an_stop)
        )
        coord = Coordinator(coord_conn, "test", led, [key.public_b64()], analyzer_key.public_b64())
        rep = await asyncio.wait_for(
            coord.run_round(
                RoundParams(k=4, eps0=1.0, n_min=10, deadline_seconds=60),
                answer=send_then_restart_mix,
            ),
            60,
        )
        restart_stop.set()
        an_stop.set()
        await asyncio.wait_for(asyncio.gather(analyzer, *restarted), 10)
    assert rep.released and rep.abort is None and rep.result is not None
    assert rep.result.batch_size == users
    assert [r.status for r in led.status("test").rounds] == ["committed"]


class _Refusing:
    """A connection whose broker refuses it with `exc` (the first `fails` times)."""

    def __init__(self, exc: Exception, tries: list[int], fails: int = 10**9) -> None:
        self.exc, self.tries, self.fails = exc, tries, fails

    async def __aenter__(self) -> _Refusing:
        self.tries.append(1)
        if len(self.tries) <= self.fails:
            raise self.exc
        return self

    async def __aexit__(self, *_: object) -> None:
        return None


async def test_a_refused_login_at_start_is_an_error_not_a_retry_loop() -> None:
    """A wrong password or an untrusted CA was retried for ever, a warning every 30 s; before
    the first connection it is a configuration error now. A lost connection still retries."""
    tries: list[int] = []
    stop = asyncio.Event()
    with pytest.raises(BrokerAuthError):  # (bounded: the old loop never ended)
        await asyncio.wait_for(
            with_reconnect(
                "mix 0",
                lambda: _Refusing(BrokerAuthError("not authorized"), tries),
                lambda _t: asyncio.sleep(0),
                stop,
            ),
            10,
        )
    assert len(tries) == 1
    tries.clear()
    done: list[int] = []

    async def body(_t: object) -> None:
        done.append(1)

    await with_reconnect(
        "mix 0",
        lambda: _Refusing(TransportError("connection refused"), tries, fails=2),
        body,
        stop,
    )
    assert len(tries) == 3 and done == [1]  # refused twice (a broker not up yet), then served


async def test_a_refused_login_after_a_first_connection_is_retried() -> None:
    """Once a service has connected, every loss is retried, a refused login too (a broker
    restarting reads its password file late): only before the first connection is it a
    configuration error. Raised here, a hop or coordinator exited mid-round."""
    tries: list[int] = []
    bodies: list[int] = []

    async def body(_t: object) -> None:
        bodies.append(1)
        if len(bodies) == 1:
            raise BrokerAuthError("not authorized")

    await asyncio.wait_for(
        with_reconnect(
            "mix 0", lambda: _Refusing(TransportError("x"), tries, 0), body, stop=asyncio.Event()
        ),
        10,
    )
    assert len(tries) == 2 and len(bodies) == 2


def test_a_close_at_below_n_min_is_refused_when_the_coordinator_starts(tmp_path: Path) -> None:
    """It was refused at each round instead, after connecting: a service in a crash loop."""
    from shufflekit.app.services.runtime import serve_coordinator
    from shufflekit.app.sim.world import SimSpec, World

    spec = SimSpec(seed=0, real_crypto=True)  # real keys: a service refuses stand-in ones
    cfg = World(spec, tmp_path).cfg  # a whole configuration, budget n_min 10
    early = cfg.model_copy(
        update={"coordinator": cfg.coordinator.model_copy(update={"close_at": 5})}
    )
    says = r"\[coordinator\] close_at 5 is below the round's n_min 10"
    with pytest.raises(ConfigError, match=says):
        asyncio.run(asyncio.wait_for(serve_coordinator(early, asyncio.Event()), 10))


def test_a_logged_exception_is_one_line_unless_debugging() -> None:
    """An outside audit saw aiomqtt log a KeyError traceback on a second SIGTERM; a service's
    log shows any logged exception on its line, type and message, unless asked for more."""
    import logging

    from shufflekit.app.services.cli import OneLineFormatter

    try:
        raise KeyError("40")
    except KeyError:
        import sys

        record = logging.LogRecord(
            "aiomqtt", logging.ERROR, __file__, 1, "on_subscribe failed", None, sys.exc_info()
        )
    fmt = "%(name)s %(levelname)s %(message)s"
    line = OneLineFormatter(fmt, tracebacks=False).format(record)
    assert line == "aiomqtt ERROR on_subscribe failed (KeyError: '40')"
    full = OneLineFormatter(fmt, tracebacks=True).format(record)
    assert "Traceback (most recent call last)" in full and full.count("\n") > 2
    assert OneLineFormatter(fmt, tracebacks=False).format(record) == line  # record untouched
