"""Control messages (JSON validated by pydantic): announce, close, manifest, abort, result.

Anyone who can publish on a topic can send a control message, so every field is checked before
use: finite numbers only, names in the topic-safe character set, bounded sizes. A message that
fails is refused whole with InvalidReport('bad_control'), which the reader counts.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)

from shufflekit.base.clock import Clock, system_clock
from shufflekit.base.errors import InvalidInput, InvalidReport
from shufflekit.base.names import NAME_PATTERN
from shufflekit.core.wire import MAX_RECORD_BITS

PROTOCOL_VERSION = 1
MAX_CONTROL_BYTES = 8 * 1024 * 1024  # the largest result (k = 2^16, three vectors) fits
MAX_HOPS = 16  # mixes in one cascade
MAX_REASON = 500  # characters of a free-text reason

Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]  # in topics and HPKE info
Key = Annotated[str, StringConstraints(min_length=1, max_length=256)]
Text = Annotated[str, StringConstraints(max_length=MAX_REASON)]
MECHANISMS = ("krr", "bits")


def one_line(exc: ValidationError) -> str:
    """A pydantic error in one line: `field: problem` for each, joined by '; '."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'message'}: "
        + e["msg"].removeprefix("Value error, ")
        for e in exc.errors()
    )


class _Control(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    version: int = PROTOCOL_VERSION

    def to_bytes(self) -> bytes:
        """Compact JSON for the wire."""
        return self.model_dump_json().encode()

    @classmethod
    def build(cls, **fields: Any) -> Self:
        """The message from Python values; InvalidInput, in one line, if it is not valid."""
        try:
            return cls(**fields)
        except ValidationError as exc:
            raise InvalidInput(f"invalid {cls.__name__}: {one_line(exc)}") from None

    @classmethod
    def from_bytes(cls, data: bytes) -> _Control:
        """Parse and validate; InvalidReport('bad_control') on anything malformed or oversize."""
        if len(data) > MAX_CONTROL_BYTES:
            raise InvalidReport(
                "bad_control", f"{cls.__name__} of {len(data)} bytes (limit {MAX_CONTROL_BYTES})"
            )
        try:
            msg = cls.model_validate_json(data)
        except ValidationError as exc:
            raise InvalidReport("bad_control", f"invalid {cls.__name__}: {one_line(exc)}") from None
        if msg.version != PROTOCOL_VERSION:
            raise InvalidReport("bad_version", f"{cls.__name__} version {msg.version}")
        return msg


class Announcement(_Control):
    """Round R is open: its parameters and the public keys to encrypt to (mix 0 first).

    `mechanism` is "krr" (k-RR over k values) or "bits" (each bit of an L-bit record flipped,
    `bits` = L, and k = 2^L, the number of possible records); eps0 is per report either way.
    """

    deployment: Name
    round_id: Name
    k: int = Field(ge=2, le=1 << MAX_RECORD_BITS)
    eps0: float = Field(gt=0, lt=710)  # exp(eps0) must be a finite float
    n_min: int = Field(ge=1)
    deadline: float  # unix time after which mix 0 stops accepting (finite, as every number)
    mix_keys: list[Key] = Field(min_length=1, max_length=MAX_HOPS)
    analyzer_key: Key
    # mix 0's receipt key (Ed25519, base64): clients verify its receipts (core/receipts.py);
    # None: an older deployment without receipts, where clients can only count PUBACKs
    receipt_key: Key | None = None
    mechanism: Literal["krr", "bits"] = "krr"
    bits: int | None = Field(default=None, ge=1, le=MAX_RECORD_BITS)
    result_key: Key | None = None  # the analyzer's result public key (core/results.py)
    # mix 0 closes ingest once this many accepted (enrolled, de-duplicated) reports are stored
    close_at: int | None = Field(default=None, ge=1)

    def to_bytes(self) -> bytes:
        """Compact JSON for the wire (without `close_at` when the round has none)."""
        drop = {"close_at"} if self.close_at is None else None
        return self.model_dump_json(exclude=drop).encode()

    @model_validator(mode="after")
    def _mechanism_matches(self) -> Self:
        if self.mechanism == "bits":
            if self.bits is None or self.k != 1 << self.bits:
                raise ValueError("a bits round needs bits = L and k = 2^L")
        elif self.bits is not None or self.k > 65535:
            raise ValueError("a krr round has k <= 65535 and no bits")
        return self

    @property
    def report_size(self) -> int:
        """The size field of this round's reports: k for k-RR, L for bits."""
        return self.bits if self.mechanism == "bits" and self.bits is not None else self.k

    @property
    def hops(self) -> int:
        """Number of mixes L; the analyzer is hop L."""
        return len(self.mix_keys)

    def seconds_left(self, clock: Clock = system_clock) -> float:
        """Time until the deadline on `clock` (negative once passed)."""
        return self.deadline - clock.time()


class Close(_Control):
    """The coordinator ends ingest early (all simulated clients have sent)."""

    round_id: Name
    reason: Text = "coordinator"


class Manifest(_Control):
    """What hop `hop` must receive: count and digest of the whole permuted batch."""

    round_id: Name
    hop: int = Field(ge=0, le=MAX_HOPS)
    count: int = Field(ge=0, le=100_000_000)
    chunks: int = Field(ge=0, le=10_000_000)
    item_size: int = Field(ge=1, le=1_000_000)
    digest: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


class Abort(_Control):
    """Hop `hop` released nothing for this round; `reason` says why."""

    round_id: Name
    hop: int = Field(ge=-1, le=MAX_HOPS)  # -1: the coordinator
    reason: Text
    received: int = Field(default=0, ge=0)

    @property
    def source(self) -> str:
        """Who aborted the round, for people: "the coordinator" or "hop I"."""
        return "the coordinator" if self.hop < 0 else f"hop {self.hop}"


class Result(_Control):
    """The analyzer's published result of one round."""

    round_id: Name
    k: int = Field(ge=2, le=1 << MAX_RECORD_BITS)
    eps0: float = Field(gt=0, lt=710)
    batch_size: int = Field(ge=0)
    histogram: list[Annotated[int, Field(ge=0)]] = Field(max_length=1 << MAX_RECORD_BITS)
    estimate: list[float] = Field(max_length=1 << MAX_RECORD_BITS)
    stderr: list[float] = Field(max_length=1 << MAX_RECORD_BITS)
    estimator: Name
    rejected: dict[Name, Annotated[int, Field(ge=0)]] = Field(max_length=256)
    privacy: dict[str, float | bool | str | None] = Field(default_factory=dict)
    # iterative estimators (ibu): whether the fit met its tolerance, and after how many steps
    converged: bool | None = None
    iterations: int | None = None
    # bit-vector rounds: histogram/estimate/stderr are over the 2^L records (the estimate only
    # for L <= 10, else empty); per-bit frequencies of ones and their standard errors here
    mechanism: Literal["krr", "bits"] = "krr"
    bits: int | None = Field(default=None, ge=1, le=MAX_RECORD_BITS)
    bit_frequency: list[float] | None = Field(default=None, max_length=MAX_RECORD_BITS)
    bit_stderr: list[float] | None = Field(default=None, max_length=MAX_RECORD_BITS)
    # the analyzer's Ed25519 signature over everything above (core/results.py)
    signature: str | None = Field(default=None, max_length=100)

    @classmethod
    def stored(cls, text: str) -> Result | None:
        """The result a ledger stored with its round's commit (published from there, also
        after a restart), or None if the text is not a valid one."""
        try:
            msg = cls.from_bytes(text.encode())
        except InvalidReport:
            return None
        return msg if isinstance(msg, Result) else None


class Ready(_Control):
    """Hop `hop` is subscribed to its input for this round and holds the announced key.

    Services answer the coordinator's prepare with it, so that the announcement reaches clients
    only once every hop listens (nothing a client sends can be missed). The coordinator is
    hop -1 in aborts it publishes itself.
    """

    round_id: Name
    hop: int = Field(ge=0, le=MAX_HOPS)
    key: Key


class GoRequest(_Control):
    """Mix `hop` holds round `round_id`'s permuted batch and asks the coordinator whether it
    may forward it (it never forwards without a `Go`: a lost retained abort cannot matter).
    With `done`, the mix has finished with the round (forwarded or aborted): it returns its
    go, so that a refund need not wait for the lease to run out."""

    round_id: Name
    hop: int = Field(ge=0, le=MAX_HOPS)
    done: bool = False


class Go(_Control):
    """The coordinator's answer to a `GoRequest`, from its ledger: `go` (forward, only until
    `until`, unix time: the coordinator refunds nothing before it), `committed` (the analyzer
    has the batch already: nothing to forward) or `refused` (aborted or refunded: never)."""

    round_id: Name
    hop: int = Field(ge=0, le=MAX_HOPS)
    verdict: Literal["go", "committed", "refused"]
    until: float | None = None
    reason: Text = ""  # why a go was refused, for the mix's abort

    @model_validator(mode="after")
    def _go_has_an_end(self) -> Self:
        if (self.verdict == "go") != (self.until is not None):
            raise ValueError("a go (and only a go) has an end")
        return self
