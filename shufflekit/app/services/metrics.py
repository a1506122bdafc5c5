"""Prometheus metrics of a running service: reports received, accepted and rejected by reason,
rounds by outcome, batch sizes and round durations, served over HTTP for a scraper.

`[metrics] port` (0, the default, disables it) is a base port: mix I listens on port + I, the
analyzer on port + L and the coordinator on port + L + 1 (L = `mixes`), so one configuration
serves every role of a machine without clashes. Each service has its own registry.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from shufflekit.base.errors import ConfigError

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from shufflekit.analyzer.service import Analyzer
    from shufflekit.app.hops import HopRunner
    from shufflekit.app.rounds import HopOutcome, RoundReport
    from shufflekit.core.messages import Announcement
    from shufflekit.core.transport.base import Transport
    from shufflekit.shuffler.mix import MixNode

log = logging.getLogger("shufflekit.services")

BATCH_BUCKETS = (10, 100, 1_000, 10_000, 100_000, 1_000_000)
DURATION_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600)


class MetricsSettings(BaseModel):
    """`[metrics]`: where each service serves its Prometheus metrics."""

    model_config = ConfigDict(extra="forbid")

    port: int = Field(default=0, ge=0, le=65535, description="base port; 0 disables metrics")
    host: str = Field(default="127.0.0.1", description="address to listen on")

    def port_for(self, offset: int) -> int:
        """The port of the service at `offset` (mix index; L: analyzer; L + 1: coordinator)."""
        if self.port == 0:
            return 0
        port = self.port + offset
        if port > 65535:
            raise ConfigError(f"[metrics] port {self.port} + {offset} is beyond 65535")
        return port


class ServiceMetrics:
    """The metrics of one service and the HTTP endpoint that serves them."""

    def __init__(self, service: str) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram, Info

        self.service = service
        self.registry = CollectorRegistry()
        r = self.registry
        Info("shufflekit_service", "Which role this process runs.", registry=r).info(
            {"service": service}
        )
        self.received = Counter(
            "shufflekit_reports_received", "Inputs received (accepted or rejected).", registry=r
        )
        self.accepted = Counter("shufflekit_reports_accepted", "Inputs accepted.", registry=r)
        self.rejected = Counter(
            "shufflekit_reports_rejected", "Inputs rejected, by reason.", ["reason"], registry=r
        )
        self.control_rejected = Counter(
            "shufflekit_control_rejected",
            "Control messages (prepare, ready, result, abort) refused, by reason.",
            ["reason"],
            registry=r,
        )
        self.rounds = Counter(
            "shufflekit_rounds", "Rounds finished, by outcome.", ["outcome"], registry=r
        )
        self.batch_size = Histogram(
            "shufflekit_batch_size",
            "Size of each batch this service released.",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.round_duration = Histogram(
            "shufflekit_round_duration_seconds",
            "Seconds this service spent on each round.",
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    def observe_hop(self, out: HopOutcome | None, seconds: float) -> None:
        """A mix's or the analyzer's round: what it received, accepted, rejected, released.
        `out` is None when another hop aborted the round before this one counted anything."""
        from shufflekit.shuffler.mix import MixOutcome

        self.round_duration.observe(seconds)
        if out is None:
            self.rounds.labels("aborted_elsewhere").inc()
            return
        c = out.counters
        self.accepted.inc(c.accepted)
        self.received.inc(c.accepted + sum(c.rejected.values()))
        for reason, n in c.rejected.items():
            self.rejected.labels(reason).inc(n)
        if out.aborted_elsewhere:
            self.rounds.labels("aborted_elsewhere").inc()
            return
        if isinstance(out, MixOutcome):
            size = out.forwarded if out.released else None
        else:
            size = out.result.batch_size if out.result is not None else None
        self.rounds.labels("released" if size is not None else "aborted").inc()
        if size is not None:
            self.batch_size.observe(size)

    def observe_round(self, rep: RoundReport | None, seconds: float = 0.0) -> None:
        """The coordinator's round: its outcome, duration and released batch size. None: the
        round ended without a result or an abort (its reservation stays counted)."""
        if rep is None:
            self.rounds.labels("failed").inc()
            self.round_duration.observe(seconds)
            return
        self.rounds.labels("released" if rep.released else "aborted").inc()
        self.round_duration.observe(rep.seconds)
        if rep.result is not None:
            self.batch_size.observe(rep.result.batch_size)

    def dropped_input(self, reason: str) -> None:
        """Count one input mix 0 dropped outside any round it serves (a listener)."""
        self.received.inc()
        self.rejected.labels(reason).inc()

    def control_rejection(self, reason: str) -> None:
        """Count one refused control message (a `RejectionCounter` listener)."""
        self.control_rejected.labels(reason).inc()

    def serve(self, host: str, port: int) -> None:
        """Serve `/metrics` on host:port in a daemon thread; ConfigError if it cannot listen."""
        from prometheus_client import start_http_server

        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise ConfigError(
                f"{self.service}: cannot serve metrics on {host}:{port}: {exc.strerror}; "
                "change [metrics] port (0 disables metrics)"
            ) from None
        self.port = port
        log.info("%s: metrics on http://%s:%d/metrics", self.service, host, port)

    def close(self) -> None:
        """Stop the HTTP endpoint (idempotent)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None


def start_metrics(settings: MetricsSettings, service: str, offset: int) -> ServiceMetrics | None:
    """The service's metrics, served on `settings.port + offset`; None if metrics are off."""
    port = settings.port_for(offset)
    if port == 0:
        return None
    m = ServiceMetrics(service)
    m.serve(settings.host, port)
    return m


def hop_runner(
    metrics: ServiceMetrics | None, node: MixNode | Analyzer, transport: Transport, deployment: str
) -> HopRunner:
    """The `HopRunner` of a mix or the analyzer; with metrics, it records every round."""
    from shufflekit.app.hops import HopRunner

    if metrics is None:
        return HopRunner(node, transport, deployment)
    m = metrics

    class MeteredHopRunner(HopRunner):
        async def run_round(
            self, ann: Announcement, stop: asyncio.Event | None = None
        ) -> HopOutcome | None:
            started = time.monotonic()
            out = await super().run_round(ann, stop)
            m.observe_hop(out, time.monotonic() - started)
            return out

    runner = MeteredHopRunner(node, transport, deployment)
    runner.control.on_reject = m.control_rejection
    from shufflekit.shuffler.mix import MixNode

    if isinstance(node, MixNode):
        node.dropped.on_reject = m.dropped_input
    return runner
