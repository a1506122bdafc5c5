"""MQTT 5 transport over aiomqtt: QoS 1, bounded in-flight publishes, per-filter routing.

aiomqtt gives one message stream per connection; a dispatcher task routes each message to
every subscription whose filter matches. aiomqtt has no back-pressure of its own, so publishes
are bounded by a semaphore (an unbounded burst of publishes times out).

Secured brokers (deploy/mosquitto): `mqtts://` URLs connect over TLS, trusting a given CA file
(or the system's CAs), optionally presenting a client certificate, and log in with a user name
and password. What the broker refuses (the TLS handshake, the login, a publish or subscribe its
ACL denies) raises a typed TransportError that says what to check; passwords never appear in
messages or reprs.

Durable services (see "Durability" in deploy/README.md) connect with a fixed client id and a
persistent session (`session_expiry`), so the broker keeps their subscriptions and queues QoS 1
messages while they are away, and name their `durable_filters`: a message on those is not
acknowledged when it arrives but only when the service calls `ack(message)` (after spooling
it); one that arrives before the service has subscribed again is held for that subscription.
Every other message is acknowledged on arrival.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import aiomqtt
from aiomqtt.exceptions import MqttConnectError
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from shufflekit.base.errors import (
    BrokerAccessDenied,
    BrokerAuthError,
    BrokerTLSError,
    ConfigError,
    TransportError,
)
from shufflekit.core.transport.base import (
    Message,
    Subscription,
    Transport,
    check_publish,
    topic_matches,
)
from shufflekit.core.transport.mqtt_link import ClosedBeforeConnack, MqttLink

__all__ = [
    "ENV_CA_FILE",
    "ENV_CERT_FILE",
    "ENV_KEY_FILE",
    "ENV_PASSWORD",
    "ENV_USERNAME",
    "BrokerAccessDenied",
    "BrokerAddress",
    "BrokerAuthError",
    "BrokerTLSError",
    "MqttMessage",
    "MqttTransport",
]

# paho's own log lines (aiomqtt passes them to a logger): a service's log handlers get them;
# a command that configures no logging does not print them through logging's last resort
# above the one-line error that already says what went wrong ("failed to receive on socket").
_PAHO_LOG = logging.getLogger("shufflekit.transport.paho")
_PAHO_LOG.addHandler(logging.NullHandler())

# Environment variables read by BrokerAddress.parse when neither the URL nor an argument
# gives the value (the password belongs here or in a secret file, not on a command line).
ENV_USERNAME = "SHUFFLEKIT_MQTT_USERNAME"
ENV_PASSWORD = "SHUFFLEKIT_MQTT_PASSWORD"
ENV_CA_FILE = "SHUFFLEKIT_MQTT_CA_FILE"
ENV_CERT_FILE = "SHUFFLEKIT_MQTT_CERT_FILE"
ENV_KEY_FILE = "SHUFFLEKIT_MQTT_KEY_FILE"

# CONNACK codes meaning "these credentials are not accepted": MQTT 5 (bad user name or
# password, not authorized, bad authentication method) and MQTT 3.1.1 (4, 5).
_LOGIN_REFUSED = {0x86, 0x87, 0x8C, 4, 5}


def _path(value: str | os.PathLike[str] | None) -> Path | None:
    return Path(value) if value not in (None, "") else None


@dataclass(frozen=True)
class BrokerAddress:
    """Where the broker is and how to log in: parsed from `mqtt[s]://user:pass@host:port`."""

    host: str
    port: int
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: bool = False
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    @classmethod
    def parse(
        cls,
        url: str,
        *,
        username: str | None = None,
        password: str | None = None,
        ca_file: str | os.PathLike[str] | None = None,
        cert_file: str | os.PathLike[str] | None = None,
        key_file: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> BrokerAddress:
        """Parse `mqtt://` (plain) or `mqtts://` (TLS) URLs; ConfigError if malformed.

        Each setting comes from the argument, else the URL, else the environment
        (`SHUFFLEKIT_MQTT_USERNAME`, `..._PASSWORD`, and for mqtts:// only `..._CA_FILE`,
        `..._CERT_FILE`, `..._KEY_FILE`); `env` defaults to os.environ.
        """
        environ: Mapping[str, str] = os.environ if env is None else env
        shown = _redact_url(url)
        try:
            u = urlparse(url)
            hostname = u.hostname
        except ValueError:
            raise ConfigError(f"broker URL is malformed: {shown!r}") from None
        if u.scheme not in ("mqtt", "mqtts") or not hostname:
            raise ConfigError(f"broker URL must look like mqtt[s]://host:port, got {shown!r}")
        if u.path not in ("", "/") or u.query or u.fragment or u.params:
            raise ConfigError(f"broker URL takes no path or query, got {shown!r}")
        tls = u.scheme == "mqtts"
        if u.netloc.endswith(":"):  # urlparse reads "host:" as no port: a slip, not the default
            raise ConfigError(f"broker URL has an empty port: {shown!r}")
        try:
            port = u.port if u.port is not None else (8883 if tls else 1883)
        except ValueError:
            raise ConfigError(f"broker URL has an invalid port: {shown!r}") from None
        if not 0 < port < 65536:
            raise ConfigError(f"broker URL has an invalid port: {shown!r}")
        files = {"ca_file": ca_file, "cert_file": cert_file, "key_file": key_file}
        if not tls:
            given = [name for name, value in files.items() if value]
            if given:
                raise ConfigError(
                    f"{', '.join(given)} given for a plain broker URL {shown!r}: "
                    "use mqtts:// to connect over TLS"
                )
        else:
            for name, var in (
                ("ca_file", ENV_CA_FILE),
                ("cert_file", ENV_CERT_FILE),
                ("key_file", ENV_KEY_FILE),
            ):
                files[name] = files[name] or environ.get(var) or None
        user = username or (unquote(u.username) if u.username else None)
        secret = password or (unquote(u.password) if u.password is not None else None)
        return cls(
            host=hostname,
            port=port,
            username=user or environ.get(ENV_USERNAME) or None,
            password=secret if secret is not None else environ.get(ENV_PASSWORD),
            tls=tls,
            ca_file=_path(files["ca_file"]),
            cert_file=_path(files["cert_file"]),
            key_file=_path(files["key_file"]),
        )

    def redacted(self) -> str:
        """The address as a URL without the password: safe for logs and error messages."""
        user = f"{self.username}:***@" if self.password else f"{self.username}@"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return (
            f"{'mqtts' if self.tls else 'mqtt'}://{user if self.username else ''}{host}:{self.port}"
        )

    def __str__(self) -> str:
        return self.redacted()

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS settings: verify the broker against `ca_file` (else the system's CAs).

        Raises ConfigError when a file is missing or not a usable PEM certificate or key.
        """
        if self.ca_file is not None and not self.ca_file.is_file():
            raise ConfigError(f"CA file {self.ca_file} does not exist (broker {self})")
        try:
            ctx = ssl.create_default_context(
                cafile=str(self.ca_file) if self.ca_file is not None else None
            )
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(
                f"CA file {self.ca_file} holds no usable certificate: {exc}"
            ) from None
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.key_file is not None and self.cert_file is None:
            raise ConfigError(f"a client key file ({self.key_file}) needs a certificate file")
        if self.cert_file is not None:
            for f in (self.cert_file, self.key_file):
                if f is not None and not f.is_file():
                    raise ConfigError(f"client certificate or key file {f} does not exist")
            try:
                # an empty passphrase: an encrypted key fails here instead of prompting on a tty
                ctx.load_cert_chain(self.cert_file, self.key_file, password=b"")
            except (ssl.SSLError, OSError) as exc:
                raise ConfigError(
                    f"client certificate {self.cert_file} and key {self.key_file} do not load "
                    f"together (a key must be PEM and not encrypted): {exc}"
                ) from None
        return ctx


def _redact_url(url: str) -> str:
    """`url` with the password (if any) replaced by ***, for error messages."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, hostpart = rest.rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return url
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{hostpart}"


@dataclass(frozen=True)
class MqttMessage(Message):
    """A delivered message with what its acknowledgement needs (packet id and QoS)."""

    mid: int = 0
    qos: int = 0


class MqttTransport(Transport):
    """A connection to an MQTT 5 broker."""

    def __init__(
        self,
        address: BrokerAddress,
        *,
        client_id: str | None = None,
        tls_context: ssl.SSLContext | None = None,
        max_inflight: int = 100,
        timeout: float = 30.0,
        session_expiry: int | None = None,
        durable_filters: Sequence[str] = (),
        max_packet_size: int | None = None,
    ) -> None:
        """`session_expiry` (seconds) asks for a persistent session under `client_id` (give a
        fixed one); messages matching `durable_filters` are acked only by `ack()`."""
        self._address = address
        self._session_expiry = session_expiry
        self._max_packet = max_packet_size  # MQTT 5: the broker sends nothing larger
        self._durable = list(durable_filters)
        self._held: list[MqttMessage] = []
        self._client_id = client_id or f"sk-{uuid.uuid4().hex[:12]}"
        self._tls_context = tls_context
        self._inflight = asyncio.Semaphore(max_inflight)
        self._max_inflight = max_inflight
        self._timeout = timeout
        self._link: MqttLink | None = None
        self._subs: list[Subscription] = []
        self._dispatcher: asyncio.Task[None] | None = None

    @property
    def connected(self) -> bool:
        """Whether the connection is up (its dispatcher still runs)."""
        return (
            self._link is not None and self._dispatcher is not None and not self._dispatcher.done()
        )

    @property
    def client_id(self) -> str:
        """The MQTT client id of this connection (a receipt's reply id)."""
        return self._client_id

    @property
    def address(self) -> BrokerAddress:
        """The broker this transport connects to."""
        return self._address

    async def connect(self) -> None:
        addr = self._address
        tls = self._tls_context
        if addr.tls and tls is None:
            tls = addr.ssl_context()
        session: dict[str, Any] = {}
        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        if self._max_packet is not None:
            props.MaximumPacketSize = self._max_packet
            session = {"properties": props}
        if self._session_expiry is not None:
            props.SessionExpiryInterval = self._session_expiry
            session = {"clean_start": False, "properties": props}
        client = aiomqtt.Client(
            addr.host,
            addr.port,
            username=addr.username,
            password=addr.password,
            identifier=self._client_id,
            protocol=aiomqtt.ProtocolVersion.V5,
            tls_context=tls,
            timeout=self._timeout,
            max_inflight_messages=self._max_inflight,
            logger=_PAHO_LOG,
            **session,
        )
        link = MqttLink(client, manual_ack=bool(self._durable))
        self._held.clear()
        try:
            await link.open()
        except aiomqtt.MqttError as exc:
            raise self._connect_error(exc) from exc
        self._link = link
        self._dispatcher = asyncio.create_task(self._dispatch(), name=f"mqtt-{self._client_id}")

    def _connect_error(self, exc: aiomqtt.MqttError) -> TransportError:
        """Turn aiomqtt's connection error into a typed one that says what to check."""
        addr = self._address
        cause = exc.__cause__ or exc.__context__  # aiomqtt raises `from None`: the OSError
        if isinstance(cause, ssl.SSLCertVerificationError):
            trust = f"the CA file {addr.ca_file}" if addr.ca_file else "the system's CAs"
            return BrokerTLSError(
                f"TLS handshake with {addr} failed: its certificate is not trusted by {trust} "
                f"({cause.verify_message}); check the CA file and that the host name in the URL "
                "is one the broker's certificate names"
            )
        if isinstance(cause, ssl.SSLError) or (
            addr.tls and isinstance(cause, ConnectionResetError)
        ):
            reason = cause.reason if isinstance(cause, ssl.SSLError) else None
            return BrokerTLSError(
                f"TLS handshake with {addr} failed ({reason or cause}); is that port the "
                "broker's TLS listener, and does it accept this client certificate?"
            )
        if isinstance(exc, ClosedBeforeConnack):
            hint = (
                "does it require a client certificate?"
                if addr.tls
                else "if that port is a TLS listener, use mqtts://"
            )
            return TransportError(
                f"MQTT broker {addr} closed the connection before answering the login; {hint}"
            )
        rc = exc.rc if isinstance(exc, aiomqtt.MqttCodeError) else None
        code = rc.value if isinstance(rc, ReasonCode) else rc
        if isinstance(exc, MqttConnectError) and code in _LOGIN_REFUSED:
            who = f"user {addr.username!r}" if addr.username else "an anonymous client"
            return BrokerAuthError(
                f"MQTT broker {addr} refused the login of {who}: {rc} (not authorized). "
                f"Check the user name and password ({ENV_USERNAME}, {ENV_PASSWORD}, or the URL)"
            )
        return TransportError(f"cannot connect to MQTT broker {addr}: {exc}")

    async def close(self) -> None:
        if self._dispatcher is not None:
            self._dispatcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._dispatcher
            self._dispatcher = None
        for sub in self._subs:
            sub.end()
        self._subs.clear()
        if self._link is not None:
            link, self._link = self._link, None
            await link.close()

    def _require(self) -> MqttLink:
        if self._link is None:
            raise TransportError("MQTT transport is not connected")
        return self._link

    def _who(self) -> str:
        return f"account {self._address.username!r}" if self._address.username else "this client"

    async def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        """Publish with QoS 1; BrokerAccessDenied if the broker's ACL refuses the topic."""
        payload = check_publish(topic, payload)
        link = self._require()
        async with self._inflight:
            try:
                refused = await link.publish_qos1(
                    topic, payload, retain=retain, timeout=self._timeout
                )
            except TransportError as exc:
                raise TransportError(f"publish to {topic!r} failed: {exc}") from exc
        if refused is not None:
            raise BrokerAccessDenied(
                f"broker {self._address} refused a publish to {topic!r} by {self._who()}: "
                f"{refused} (its ACL does not let this account write there)",
                topic,
            )

    def subscribe(self, topic_filter: str) -> AbstractAsyncContextManager[Subscription]:
        return self._subscription(topic_filter)

    def ack(self, message: Message) -> None:
        """Acknowledge a message of a durable filter (its PUBACK); no-op for any other."""
        link = self._link
        if link is None or not self._durable or not isinstance(message, MqttMessage):
            return
        if message.qos > 0:
            link.ack(message.mid, message.qos)

    @asynccontextmanager
    async def _subscription(self, topic_filter: str) -> AsyncIterator[Subscription]:
        client = self._require().client
        sub = Subscription(topic_filter)
        self._subs.append(sub)
        try:
            granted = await client.subscribe(topic_filter, qos=1, timeout=self._timeout)
        except aiomqtt.MqttError as exc:
            self._subs.remove(sub)
            raise TransportError(f"subscribe to {topic_filter!r} failed: {exc}") from exc
        refused = [rc for rc in granted if isinstance(rc, ReasonCode) and rc.is_failure]
        if refused:
            self._subs.remove(sub)
            raise BrokerAccessDenied(
                f"broker {self._address} refused a subscription to {topic_filter!r} by "
                f"{self._who()}: {refused[0]} (its ACL does not let this account read there)",
                topic_filter,
            )
        held = [m for m in self._held if topic_matches(topic_filter, m.topic)]
        for m in held:  # the session's messages that arrived before this subscription
            self._held.remove(m)
            sub.deliver(m)
        try:
            yield sub
        finally:
            if sub in self._subs:
                self._subs.remove(sub)
            if (
                self._link is not None
                and topic_filter not in self._durable  # the session keeps queueing for it
                and not any(s.topic_filter == topic_filter for s in self._subs)
            ):
                with contextlib.suppress(aiomqtt.MqttError):
                    await self._link.client.unsubscribe(topic_filter, timeout=self._timeout)

    async def _dispatch(self) -> None:
        client = self._require().client
        try:
            async for m in client.messages:
                payload = m.payload if isinstance(m.payload, bytes | bytearray) else b""
                msg = MqttMessage(m.topic.value, bytes(payload), mid=m.mid, qos=m.qos)
                subs = [s for s in self._subs if topic_matches(s.topic_filter, msg.topic)]
                for sub in subs:
                    sub.deliver(msg)
                if self._durable and any(topic_matches(f, msg.topic) for f in self._durable):
                    if not subs:
                        self._held.append(msg)  # acked by whoever subscribes and spools it
                elif self._durable:
                    self.ack(msg)
        except aiomqtt.MqttError:
            for sub in list(self._subs):
                sub.end()
