"""deploy/README.md's walkthrough ("Running the services"), run as documented.

The commands come from the walkthrough's code blocks and the configuration is
deploy/examples/shufflekit.toml as a user copies it (only its broker port replaced, as the
walkthrough's `sed` does). The broker is deploy/mosquitto's TLS listener with the shipped ACL
and one account per role (tests/broker_security.py); mix 0 checks client credentials. Every
service is its own OS process under its own account; 1,000 simulated clients answer; the
round must be released with exactly one histogram entry per client mix 0 accepted.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from shufflekit.accountant.ledger import Ledger
from shufflekit.app.cli import app
from shufflekit.app.services.config import load_config
from tests.broker_security import (
    SecureBroker,
    require_secure_broker,
    secure_broker,
)
from tests.service_procs import Procs

pytestmark = [pytest.mark.services, pytest.mark.mqtt]

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "deploy" / "README.md"
EXAMPLES = ROOT / "deploy" / "examples"
DEPLOYMENT = "pilot"  # the walkthrough's deployment name
USERS = 1000  # the walkthrough has 2,000 clients; half keeps the test well under a minute
N_MIN = 500  # the walkthrough's --n-min 1000, lowered with the number of clients
DEADLINE = "30"  # seconds (SHUFFLEKIT_COORDINATOR__DEADLINE); SIGTERM closes the round earlier


# ---------------------------------------------------------------------- the walkthrough's text


def walkthrough() -> str:
    """The "Running the services" section of deploy/README.md."""
    text = README.read_text()
    start = text.index("## Running the services\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def code_lines(section: str) -> list[str]:
    """The lines of the section's code blocks, with `\\` continuations joined."""
    lines: list[str] = []
    for block in re.findall(r"(?ms)^```[a-z]*\n(.*?)^```", section):
        lines += block.replace("\\\n", " ").splitlines()
    return lines


VALUE = r"(?:\$\([^)]*\)|\$\w+|[^\s$])+"  # a shell word: text or $(command)


def shufflekit_commands(section: str) -> list[tuple[dict[str, str], list[str]]]:
    """Every `shufflekit ...` command of the section: (VAR=value prefixes, argv), with comments,
    redirections and `&` left out. `$(...)` values are kept as text."""
    commands = []
    for line in code_lines(section):
        m = re.match(rf"^\s*((?:[A-Z_]+={VALUE}\s+)*)shufflekit\s(.*)$", line)
        if m is None:
            continue
        rest = re.split(r"\s(?:\d?>|&|;|\|)", " " + m[2])[0]  # cut at > 2> & ; |
        env = dict(re.findall(rf"([A-Z_]+)=({VALUE})", m[1]))
        commands.append((env, ["shufflekit", *shlex.split(rest, comments=True)]))
    return commands


def find(commands: list[tuple[dict[str, str], list[str]]], *prefix: str) -> list[Any]:
    """The documented commands that start `shufflekit PREFIX...` (failing if there is none)."""
    found = [(env, argv) for env, argv in commands if argv[1 : 1 + len(prefix)] == list(prefix)]
    assert found, f"deploy/README.md's walkthrough no longer runs `shufflekit {' '.join(prefix)}`"
    return found


def replace_option(argv: list[str], option: str, value: str) -> list[str]:
    """argv with the value of `option` replaced (the option must be there)."""
    assert option in argv, f"{option} missing from the documented {shlex.join(argv)}"
    i = argv.index(option)
    return [*argv[: i + 1], value, *argv[i + 2 :]]


def test_every_documented_command_and_option_exists() -> None:
    """Each `shufflekit` command of the walkthrough answers --help and knows its options."""
    runner = CliRunner()
    commands = shufflekit_commands(walkthrough())
    assert len(commands) >= 10, commands  # keys, budget, serve, clients: the parser still works
    for _, argv in commands:
        words = [w for w in argv[1:] if not w.startswith("-")]
        path: list[str] = []
        for w in words:  # the subcommand path: the words before the first option
            if argv.index(w) > len(path) + 1:
                break
            path.append(w)
        done = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
        assert done.exit_code == 0, f"`shufflekit {' '.join(path)} --help`: {done.output}"
        for opt in (a for a in argv if a.startswith("--")):
            assert opt in done.output, f"`{shlex.join(argv)}`: no option {opt}"


def test_example_configs_load() -> None:
    """deploy/examples/*.toml are valid (no unknown or misspelled setting) and the shared file
    is the one the walkthrough describes: TLS broker, mix 0 checking client credentials."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SHUFFLEKIT_")}
    files = sorted(EXAMPLES.glob("*.toml"))
    assert {f.name for f in files} >= {"shufflekit.toml", "mix.toml", "coordinator.toml"}
    with pytest.MonkeyPatch.context() as mp:
        for k in set(os.environ) - set(clean):
            mp.delenv(k)
        configs = {f.name: load_config(f) for f in files}
    shared = configs["shufflekit.toml"]
    assert shared.broker == "mqtts://127.0.0.1:8884"  # the walkthrough's `sed` replaces the port
    assert shared.client_id("mix0").startswith("sk-")  # the shipped broker's clientid_prefixes
    assert shared.deployment == DEPLOYMENT and shared.mixes == 2
    assert shared.mix.enrollment_key == EXAMPLES / "keys" / "enrollment.pub"
    assert shared.coordinator is not None
    assert "s|127.0.0.1:8884|127.0.0.1:$SERVICE_PORT|" in walkthrough()


# ---------------------------------------------------------------------- the deployment, run


class Services(Procs):
    """The walkthrough's processes: run in the deployment folder (`cwd`), each under its own
    broker account; logs in their own folder."""

    def account_env(self, account: str, password: str) -> dict[str, str]:
        assert self.env is not None
        return {
            **self.env,
            "SHUFFLEKIT_MQTT_USERNAME": account,
            "SHUFFLEKIT_MQTT_PASSWORD": password,
        }

    def start_as(self, name: str, argv: list[str], account: str, password: str) -> None:
        """A documented `shufflekit ...` command line (argv[0] is `shufflekit`) as `account`."""
        self.start(name, *argv[1:], env=self.account_env(account, password))


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[SecureBroker]:
    """deploy/mosquitto's configuration and ACL on a free loopback port, an account per role."""
    require_secure_broker()
    (tmp_path / "broker").mkdir()
    with secure_broker(tmp_path / "broker") as b:
        yield b


@pytest.fixture
def services(tmp_path: Path) -> Iterator[Services]:
    pilot, logs = tmp_path / "pilot", tmp_path / "logs"
    pilot.mkdir()
    logs.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHUFFLEKIT_")}
    s = Services(logs, cwd=pilot, env=env)
    try:
        yield s
    finally:
        s.kill_all()


def run_in_process(argv: list[str], folder: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A documented command that needs no broker (keys, budget), run in `folder`."""
    monkeypatch.chdir(folder)
    done = CliRunner().invoke(app, argv[1:], env={"COLUMNS": "200"})
    assert done.exit_code == 0, f"`{shlex.join(argv)}` failed:\n{done.output}"
    return done.output


def test_the_walkthrough_releases_one_entry_per_accepted_client(
    broker: SecureBroker, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    commands = shufflekit_commands(walkthrough())
    pilot = services.cwd
    for env_var in [k for k in os.environ if k.startswith("SHUFFLEKIT_")]:
        monkeypatch.delenv(env_var)

    # step 2: keys (the mixes', the analyzer's, the enrollment authority's) and the config
    keys = find(commands, "keys", "new")
    assert {argv[argv.index("--role") + 1] for _, argv in keys} == {"mix", "analyzer", "enrollment"}
    for _, argv in keys:
        run_in_process(argv, pilot, monkeypatch)
    config = (EXAMPLES / "shufflekit.toml").read_text()
    assert config.count("127.0.0.1:8884") == 1, "the walkthrough's sed expects one broker port"
    (pilot / "shufflekit.toml").write_text(
        config.replace("127.0.0.1:8884", f"127.0.0.1:{broker.service_port}")
    )

    # step 3: the budget
    [(_, init)] = find(commands, "budget", "init")
    run_in_process(replace_option(init, "--n-min", str(N_MIN)), pilot, monkeypatch)

    # step 5: the hops, then the coordinator, each under its own account, trusting the CA
    services.env["SHUFFLEKIT_MQTT_CA_FILE"] = str(broker.pki.ca.cert)
    services.env["SHUFFLEKIT_COORDINATOR__DEADLINE"] = DEADLINE  # documented override
    hops: dict[str, list[str]] = {}
    for env, argv in find(commands, "serve"):
        account = env.get("SHUFFLEKIT_MQTT_USERNAME")
        assert account in broker.passwords, f"`{shlex.join(argv)}` logs in as {account!r}"
        if argv[2] != "coordinator":
            hops[account] = argv
            services.start_as(account, argv, account, broker.passwords[account])
    assert set(hops) == {"mix0", "mix1", "analyzer"}, hops
    for name in hops:
        services.wait_log(name, f"serving deployment {DEPLOYMENT} on mqtts://", timeout=30)
    assert "credentials are NOT checked" not in services.stderr("mix0")
    [(env, coordinator)] = find(commands, "serve", "coordinator")
    services.start_as(
        "coordinator",
        [*coordinator, "--rounds", "1"],
        "coordinator",
        broker.passwords["coordinator"],
    )

    # step 6: clients, enrolled, on the shared client account
    [(env, clients)] = find(commands, "clients")
    assert env.get("SHUFFLEKIT_MQTT_USERNAME") == "client"
    assert "--enrollment-key" in clients
    argv = [a.replace("$PORT", str(broker.port)) for a in clients]
    argv = replace_option(argv, "--users", str(USERS))
    done = subprocess.run(
        [sys.executable, "-m", "shufflekit", *argv[1:]],
        cwd=pilot,
        env=services.account_env("client", broker.passwords["client"]),
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr.decode()
    sent = json.loads(done.stdout)
    assert sent["enrolled"] and sent["sent"] == USERS and sent["seconds_left_at_end"] > 0
    good = sent["good"]
    assert good == USERS - sent["bad"] and sent["bad"] > 0  # --bad-fraction 0.01

    # step 7: SIGTERM closes the round now (it reached n_min: released), then each exits 0
    assert services.stop("coordinator", timeout=30) == 0, services.stderr("coordinator")
    [line] = services.lines("coordinator")
    assert line["released"], (line, services.stderr("mix0"))
    result = line["result"]
    assert result["round_id"] == sent["round_id"]
    for name, code in services.stop_all(list(hops), timeout=30).items():
        assert code == 0, services.stderr(name)

    # exactly one histogram entry per client mix 0 accepted; every bad report rejected
    [mix0] = services.lines("mix0")
    assert mix0["accepted"] == good and sum(mix0["rejected"].values()) == sent["bad"]
    [mix1] = services.lines("mix1")
    assert (mix1["accepted"], mix1["forwarded"], mix1["rejected"]) == (good, good, {})
    [analyzer] = services.lines("analyzer")
    assert analyzer["histogram"] == result["histogram"]
    assert result["batch_size"] == good == sum(result["histogram"])

    # and the ledger says so, through the documented `budget status`
    [(_, status), *_] = find(commands, "budget", "status")
    out = run_in_process([*status, "--json"], pilot, monkeypatch)
    rounds = json.loads(out)["rounds"]
    assert [(r["round_id"], r["status"], r["batch_size"]) for r in rounds] == [
        (sent["round_id"], "committed", good)
    ]
    ledger = Ledger(f"sqlite:///{pilot / 'state' / 'ledger.db'}")
    assert [r.status for r in ledger.status(DEPLOYMENT).rounds] == ["committed"]
