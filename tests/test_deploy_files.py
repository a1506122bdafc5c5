"""The shipped service files (deploy/systemd units, deploy/compose.yaml) name commands, options
and settings that exist: each command line parses as the CLI's (an option renamed in the code
fails here, not on an operator's host), and the environment the compose file sets is read by
the configuration as its comments say (the broker, and metrics on 9100 + offset)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shufflekit.app.cli import app
from shufflekit.app.services.config import load_config
from shufflekit.core.transport.mqtt import ENV_PASSWORD

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
EXAMPLE = DEPLOY / "examples" / "shufflekit.toml"
UNITS = sorted((DEPLOY / "systemd").glob("*.service"))
COMPOSE = (DEPLOY / "compose.yaml").read_text()


def _unit_lines(unit: Path) -> dict[str, str]:
    """`Key=value` lines of a unit file (the last of a repeated key)."""
    out = {}
    for line in unit.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out


def _compose_commands() -> dict[str, list[str]]:
    """Service name -> the `command:` list of each compose service that runs shufflekit."""
    found = re.findall(r"^  (\w+):\n(?:    .*\n)*?    command: \[(.*)\]", COMPOSE, re.M)
    return {name: [w.strip().strip('"') for w in args.split(",")] for name, args in found}


def _parses(argv: list[str]) -> None:
    """The CLI takes `argv` (its options and their values exist); --help stops it there."""
    out = CliRunner().invoke(app, [*argv, "--help"])
    assert out.exit_code == 0, (argv, out.output)


def test_every_unit_runs_a_command_the_cli_takes() -> None:
    assert [u.name for u in UNITS] == [
        "shufflekit-analyzer.service",
        "shufflekit-coordinator.service",
        "shufflekit-mix@.service",
    ]
    for unit in UNITS:
        keys = _unit_lines(unit)
        argv = shlex.split(keys["ExecStart"].replace("%i", "0"))
        assert argv[0] == "/opt/shufflekit/bin/shufflekit", unit
        assert argv[1] == "serve" and "--config" in argv, unit
        _parses(argv[1:])
        assert keys["KillSignal"] == "SIGTERM", unit  # the services' clean stop


def test_the_units_passwords_go_in_the_variable_the_services_read() -> None:
    text = (DEPLOY / "systemd" / "shufflekit-mix@.service").read_text()
    assert f"{ENV_PASSWORD}=" in text


def test_every_compose_service_runs_a_command_the_cli_takes() -> None:
    commands = _compose_commands()
    assert sorted(commands) == ["analyzer", "coordinator", "mix0", "mix1"]
    for name, argv in commands.items():
        assert argv[0] == "serve", name
        _parses(argv)
    assert commands["mix1"][:4] == ["serve", "mix", "--index", "1"]


def test_the_compose_environment_sets_what_its_comments_say(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """compose.yaml sets the broker and metrics by environment over the example configuration;
    its comment promises mix I on 9100 + I, the analyzer on 9102, the coordinator on 9103."""
    env = dict(re.findall(r"^    (SHUFFLEKIT_\w+): (.*?)\s*(?:#.*)?$", COMPOSE, re.M))
    assert set(env) == {"SHUFFLEKIT_BROKER", "SHUFFLEKIT_METRICS__PORT", "SHUFFLEKIT_METRICS__HOST"}
    for key, value in env.items():
        monkeypatch.setenv(key, value.strip('"'))
    cfg = load_config(EXAMPLE)
    assert cfg.broker == "mqtt://mosquitto:1883"
    assert cfg.metrics.host == "0.0.0.0"
    ports = [cfg.metrics.port_for(i) for i in range(cfg.mixes + 2)]
    assert ports == [9100, 9101, 9102, 9103]
    assert "mix I: 9100 + I, analyzer 9102, coordinator 9103" in COMPOSE
