"""The load generator's paho client: writes many queued MQTT packets in one TLS write.

paho writes each packet with its own `send` (one TLS record and one system call per report,
and on loopback the sender also pays the broker side's delivery); under load that was about a
quarter of a Locust worker's CPU. This client joins the packets queued at the moment of a
write (QoS 1 publishes, acknowledgements, subscriptions: nothing paho acts on after the write)
into one buffer of at most `COALESCE_BYTES`. It also stops a spin: gevent's TLS socket answers
"would block" by returning 0 instead of raising, and paho then retries the same write at once,
burning a core while the broker is slow to read; raising BlockingIOError (as paho does for the
standard library's SSLWantWriteError) makes it wait until the socket is writable.
"""

from __future__ import annotations

import collections
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.client import DISCONNECT, PUBLISH
from paho.mqtt.enums import MQTTErrorCode

COALESCE_BYTES = 64 * 1024


def _joinable(p: Any) -> bool:
    """Whether paho does nothing with packet `p` once written (not a QoS 0 publish, whose
    callback fires then, nor a DISCONNECT)."""
    kind = p["command"] & 0xF0
    return kind != DISCONNECT and not (kind == PUBLISH and p["qos"] == 0)


class CoalescingClient(mqtt.Client):
    """paho's client, writing runs of queued packets in one go (see the module's docstring)."""

    def _packet_write(self) -> MQTTErrorCode:
        queue = self._out_packet
        if len(queue) > 1:
            joined = _coalesce(queue)
            queue.clear()
            queue.extend(joined)
        return super()._packet_write()

    def _sock_send(self, buf: bytes | bytearray) -> int:
        n = super()._sock_send(buf)
        if n == 0 and buf:
            self._call_socket_register_write()
            raise BlockingIOError
        return n


def _coalesce(queue: collections.deque[Any]) -> collections.deque[Any]:
    """`queue` with each run of joinable packets joined into packets of at most
    COALESCE_BYTES (a packet already partly written keeps its place and its remainder)."""
    out: collections.deque[Any] = collections.deque()
    run: bytearray | None = None
    head: Any = None
    for p in queue:
        rest = p["packet"][p["pos"] :]
        if not _joinable(p):
            out.append(p)
            run = None
            continue
        if run is not None and len(run) + len(rest) <= COALESCE_BYTES:
            run += rest
            head["to_process"] = len(run)
            continue
        run = bytearray(rest)
        head = dict(p, packet=run, pos=0, to_process=len(run))
        out.append(head)
    return out
