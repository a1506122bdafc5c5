"""Broker addresses without a broker: URL parsing, credentials, TLS files, password redaction."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from shufflekit.base.errors import ConfigError
from shufflekit.core.transport.mqtt import BrokerAddress, MqttTransport
from tests.broker_security import make_pki

SECRET = "s3cret-p@ss"


def test_url_gives_host_port_credentials_and_tls() -> None:
    a = BrokerAddress.parse("mqtts://mix0:s3cret-p%40ss@broker.example:8884", env={})
    assert (a.host, a.port, a.username, a.password, a.tls) == (
        "broker.example",
        8884,
        "mix0",
        SECRET,
        True,
    )
    assert BrokerAddress.parse("mqtts://h", env={}).port == 8883
    assert BrokerAddress.parse("mqtt://h/", env={}).port == 1883
    assert BrokerAddress.parse("mqtt://[::1]:1884", env={}).redacted() == "mqtt://[::1]:1884"


def test_arguments_override_the_url_which_overrides_the_environment() -> None:
    env = {
        "SHUFFLEKIT_MQTT_USERNAME": "env-user",
        "SHUFFLEKIT_MQTT_PASSWORD": "env-pass",
        "SHUFFLEKIT_MQTT_CA_FILE": "/env/ca.crt",
    }
    from_env = BrokerAddress.parse("mqtts://h", env=env)
    assert (from_env.username, from_env.password, from_env.ca_file) == (
        "env-user",
        "env-pass",
        Path("/env/ca.crt"),
    )
    from_url = BrokerAddress.parse("mqtts://u:p@h", env=env)
    assert (from_url.username, from_url.password) == ("u", "p")
    explicit = BrokerAddress.parse(
        "mqtts://u:p@h", username="x", password="y", ca_file="/etc/ca.pem", env=env
    )
    assert (explicit.username, explicit.password, explicit.ca_file) == (
        "x",
        "y",
        Path("/etc/ca.pem"),
    )


def test_tls_files_need_mqtts() -> None:
    # from the environment they only apply to mqtts:// (a plain test broker still works) ...
    plain = BrokerAddress.parse("mqtt://h", env={"SHUFFLEKIT_MQTT_CA_FILE": "/env/ca.crt"})
    assert plain.ca_file is None and not plain.tls
    # ... given explicitly with mqtt://, they are a mistake worth stopping for
    with pytest.raises(ConfigError, match="use mqtts://"):
        BrokerAddress.parse("mqtt://h", ca_file="/etc/ca.pem", env={})


@pytest.mark.parametrize(
    "bad",
    [
        "http://x",
        "mqtt://",
        "mqtt://h:notaport",
        "mqtts://h:",  # an empty port is a slip, not the default port
        f"mqtts://u:{SECRET}@h:",
        "mqtt://h:0",
        "mqtt://h:70000",
        "mqtt://h:1883/some/path",
        "mqtts://h?ca=/etc/ca.pem",
        "mqtt://[::1",
        f"tcp://admin:{SECRET}@h:1883",
    ],
)
def test_bad_urls_are_config_errors_without_the_password(bad: str) -> None:
    with pytest.raises(ConfigError) as err:
        BrokerAddress.parse(bad, env={})
    assert SECRET not in str(err.value)


def test_password_never_shown() -> None:
    a = BrokerAddress.parse(f"mqtts://mix0:{SECRET}@h:8883", env={})
    assert SECRET not in repr(a) and SECRET not in str(a)
    assert str(a) == a.redacted() == "mqtts://mix0:***@h:8883"


def test_ssl_context_trusts_only_the_given_ca(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    ctx = BrokerAddress.parse("mqtts://h", ca_file=pki.ca.cert, env={}).ssl_context()
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert [c["subject"] for c in ctx.get_ca_certs()] == [
        ((("commonName", "shufflekit-test-ca"),),)
    ]
    with_cert = BrokerAddress.parse(
        "mqtts://h",
        ca_file=pki.ca.cert,
        cert_file=pki.client.cert,
        key_file=pki.client.key,
        env={},
    )
    with_cert.ssl_context()  # the pair loads together


def test_unusable_tls_files_are_config_errors(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    not_pem = tmp_path / "not-a-cert.pem"
    not_pem.write_text("hello\n")
    cases: list[tuple[dict[str, Path], str]] = [
        ({"ca_file": tmp_path / "missing.crt"}, "does not exist"),
        ({"ca_file": not_pem}, "no usable certificate"),
        ({"key_file": pki.client.key}, "needs a certificate"),
        ({"cert_file": pki.client.cert, "key_file": tmp_path / "none.key"}, "does not exist"),
        ({"cert_file": pki.client.cert, "key_file": pki.server.key}, "do not load together"),
    ]
    for files, message in cases:
        address = BrokerAddress.parse("mqtts://h", **files, env={})  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match=message):
            address.ssl_context()


async def test_missing_ca_fails_before_any_network(tmp_path: Path) -> None:
    # port 9 on a documentation address: nothing is contacted, the CA check comes first
    address = BrokerAddress.parse("mqtts://192.0.2.1:9", ca_file=tmp_path / "nope.crt", env={})
    with pytest.raises(ConfigError, match=r"nope\.crt does not exist"):
        await MqttTransport(address, timeout=1).connect()
