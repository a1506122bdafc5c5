"""Round types and a planned budget's schedule: what kind of round slot i of a budget must be,
fixed when the budget is created, so that composing the realised rounds is a valid guarantee.

A round type is a mechanism tag, its size and eps0: `K,EPS0` is k-RR over K values, and
`bits:L,EPS0` names the bit-vector mechanism of length L (its cost comes from whatever the
accountant's policy registers under the tag "bits"). A schedule is an ordered list of types with
counts; only the last entry may have no count (it then repeats for ever).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shufflekit.accountant.core import EPS0_MAX, EPS0_MIN
from shufflekit.base.errors import InvalidParameters

KRR = "krr"
MAX_BITS = 16  # a bit-vector record travels in the 2-byte value field of the 6-byte report
MAX_K = 0xFFFF  # and a k-RR report's k in the 2-byte size field
_TAGS_WITH_PREFIX = ("bits",)  # tags written as TAG:SIZE; k-RR is written as a bare K


@dataclass(frozen=True)
class RoundType:
    """One kind of round: a mechanism tag (`krr`, `bits`, ...), its size (k or L) and eps0."""

    mechanism: str
    size: int
    eps0: float

    def __str__(self) -> str:
        head = str(self.size) if self.mechanism == KRR else f"{self.mechanism}:{self.size}"
        return f"{head},{self.eps0:g}"

    def key(self) -> str:
        """A stable text key (exact eps0) for caches."""
        return f"{self.mechanism}:{self.size}:{self.eps0!r}"


@dataclass(frozen=True)
class ScheduleEntry:
    """`count` rounds of `type` (None: every later round)."""

    type: RoundType
    count: int | None

    def __str__(self) -> str:
        return f"{self.type}" + ("" if self.count is None else f",{self.count}")


def parse_round_type(text: str) -> ScheduleEntry:
    """`K,EPS0[,COUNT]` or `bits:L,EPS0[,COUNT]` -> ScheduleEntry; InvalidParameters otherwise."""
    parts = [p.strip() for p in str(text).split(",")]
    if len(parts) not in (2, 3):
        raise InvalidParameters(
            f"round type {text!r} must be K,EPS0[,COUNT] or bits:L,EPS0[,COUNT]"
        )
    head = parts[0]
    mechanism = KRR
    if ":" in head:
        mechanism, head = (s.strip() for s in head.split(":", 1))
        if mechanism not in _TAGS_WITH_PREFIX:
            raise InvalidParameters(
                f"round type {text!r}: unknown mechanism {mechanism!r} (use K for k-RR, or "
                f"{', '.join(t + ':L' for t in _TAGS_WITH_PREFIX)})"
            )
    try:
        size = int(head)
        eps0 = float(parts[1])
        count = int(parts[2]) if len(parts) == 3 else None
    except ValueError:
        raise InvalidParameters(
            f"round type {text!r}: K (or L) and COUNT must be integers and EPS0 a number"
        ) from None
    entry = ScheduleEntry(RoundType(mechanism, size, eps0), count)
    check_entry(entry)
    return entry


def check_entry(e: ScheduleEntry) -> None:
    """InvalidParameters for a type no round could have (k < 2, eps0 not > 0, count < 1)."""
    t = e.type
    if t.size < (2 if t.mechanism == KRR else 1):
        what = "k must be >= 2" if t.mechanism == KRR else f"{t.mechanism} length must be >= 1"
        raise InvalidParameters(f"round type {e}: {what}")
    if t.mechanism == "bits" and t.size > MAX_BITS:
        raise InvalidParameters(f"round type {e}: bits length must be <= {MAX_BITS}")
    if t.mechanism == KRR and t.size > MAX_K:
        raise InvalidParameters(f"round type {e}: k must be <= {MAX_K}")
    if not (math.isfinite(t.eps0) and EPS0_MIN <= t.eps0 <= EPS0_MAX):
        raise InvalidParameters(
            f"round type {e}: eps0 must be a finite number in [{EPS0_MIN:g}, {EPS0_MAX:g}]"
        )
    if e.count is not None and e.count < 1:
        raise InvalidParameters(f"round type {e}: COUNT must be >= 1 (or left out for the last)")


def check_schedule(entries: Sequence[ScheduleEntry]) -> None:
    """Every entry valid; only the last may have no count."""
    for i, e in enumerate(entries):
        check_entry(e)
        if e.count is None and i != len(entries) - 1:
            raise InvalidParameters(
                f"round type {e} has no COUNT but is not the last: only the last entry of a "
                "schedule may repeat for ever"
            )


def slot_type(entries: Sequence[ScheduleEntry], slot: int) -> RoundType | None:
    """The type slot `slot` (0-based) must have; None past the end of a finite schedule."""
    left = slot
    for e in entries:
        if e.count is None or left < e.count:
            return e.type
        left -= e.count
    return None


def schedule_length(entries: Sequence[ScheduleEntry]) -> int | None:
    """How many rounds the schedule allows (None: unbounded)."""
    if any(e.count is None for e in entries):
        return None
    return sum(e.count or 0 for e in entries)


def schedule_from_types(types: Sequence[RoundType]) -> list[ScheduleEntry]:
    """Runs of equal consecutive types as entries, the last one open (a migrated ledger keeps
    running rounds of the type it ran last)."""
    out: list[ScheduleEntry] = []
    for t in types:
        if out and out[-1].type == t:
            out[-1] = ScheduleEntry(t, (out[-1].count or 0) + 1)
        else:
            out.append(ScheduleEntry(t, 1))
    if out:
        out[-1] = ScheduleEntry(out[-1].type, None)
    return out


def schedule_to_json(entries: Sequence[ScheduleEntry]) -> str:
    """The schedule as stored in the ledger (a JSON list)."""
    return json.dumps([schedule_entry_dict(e) for e in entries])


def schedule_entry_dict(e: ScheduleEntry) -> dict[str, Any]:
    """One entry as a JSON object (ledger column and `budget status --json`)."""
    return {
        "mechanism": e.type.mechanism,
        "size": e.type.size,
        "eps0": e.type.eps0,
        "count": e.count,
    }


def schedule_from_json(text: str | None) -> list[ScheduleEntry]:
    """Inverse of `schedule_to_json` (None or empty: no schedule)."""
    if not text:
        return []
    return [
        ScheduleEntry(RoundType(d["mechanism"], int(d["size"]), float(d["eps0"])), d["count"])
        for d in json.loads(text)
    ]
