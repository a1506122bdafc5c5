"""The event trace of one simulated seed: what happened, when (virtual), to which round.

Events carry names, counts and decisions, never payload or ciphertext bytes, so the trace (and
its SHA-256) is the same on any machine and with the real HPKE onion as with the stand-in.
"""

from __future__ import annotations

import hashlib
import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any

TAIL = 30  # events kept for a violation's report


def topic_parts(topic: str) -> dict[str, Any]:
    """`shufflekit/{dep}/round/{rid}/hop/{i}/data` -> {"kind": "data", "round": rid, "hop": i}."""
    parts = topic.split("/")
    if len(parts) >= 4 and parts[2] == "round":
        out: dict[str, Any] = {"round": parts[3], "kind": parts[-1]}
        if len(parts) >= 6 and parts[4] == "hop":
            out["hop"] = int(parts[5])
        return out
    return {"kind": parts[-1]}


@dataclass
class Trace:
    """Every event of a seed, folded into a running digest; the last few kept in full."""

    keep: bool = False  # keep every event (replaying one seed prints them all)
    events: list[dict[str, Any]] = field(default_factory=list)
    tail: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=TAIL))
    count: int = 0
    _digest: Any = field(default_factory=hashlib.sha256)

    def add(self, t: float, actor: str, event: str, **fields: Any) -> dict[str, Any]:
        """Record one event at virtual time `t` (seconds since the simulation began)."""
        topic = fields.pop("topic", None)
        if topic is not None:
            fields.update(topic_parts(topic))
        row = {"t": round(t, 6), "actor": actor, "event": event, **fields}
        line = json.dumps(row, sort_keys=True, separators=(",", ":"))
        self._digest.update(line.encode() + b"\n")
        self.count += 1
        self.tail.append(row)
        if self.keep:
            self.events.append(row)
        return row

    def sha256(self) -> str:
        return str(self._digest.hexdigest())
