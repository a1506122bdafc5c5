"""Control messages (JSON validated by pydantic): announce, close, manifest, abort, result."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shufflekit.base.clock import Clock, system_clock
from shufflekit.base.errors import InvalidReport

PROTOCOL_VERSION = 1


class _Control(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    version: int = PROTOCOL_VERSION

    def to_bytes(self) -> bytes:
        """Compact JSON for the wire."""
        return self.model_dump_json().encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> _Control:
        """Parse and validate; InvalidReport('bad_control') on anything malformed."""
        try:
            msg = cls.model_validate_json(data)
        except ValidationError as exc:
            raise InvalidReport("bad_control", f"invalid {cls.__name__}: {exc}") from None
        if msg.version != PROTOCOL_VERSION:
            raise InvalidReport("bad_version", f"{cls.__name__} version {msg.version}")
        return msg


class Announcement(_Control):
    """Round R is open: its parameters and the public keys to encrypt to (mix 0 first)."""

    deployment: str
    round_id: str
    k: int = Field(ge=2, le=65535)
    eps0: float = Field(gt=0)
    n_min: int = Field(ge=1)
    deadline: float  # unix time after which mix 0 stops accepting
    mix_keys: list[str] = Field(min_length=1)
    analyzer_key: str
    # mix 0's receipt key (Ed25519, base64): clients verify its receipts (core/receipts.py);
    # None: an older deployment without receipts, where clients can only count PUBACKs
    receipt_key: str | None = None

    @property
    def hops(self) -> int:
        """Number of mixes L; the analyzer is hop L."""
        return len(self.mix_keys)

    def seconds_left(self, clock: Clock = system_clock) -> float:
        """Time until the deadline on `clock` (negative once passed)."""
        return self.deadline - clock.time()


class Close(_Control):
    """The coordinator ends ingest early (all simulated clients have sent)."""

    round_id: str
    reason: str = "coordinator"


class Manifest(_Control):
    """What hop `hop` must receive: count and digest of the whole permuted batch."""

    round_id: str
    hop: int = Field(ge=0)
    count: int = Field(ge=0)
    chunks: int = Field(ge=0)
    item_size: int = Field(ge=1)
    digest: str


class Abort(_Control):
    """Hop `hop` released nothing for this round; `reason` says why."""

    round_id: str
    hop: int
    reason: str
    received: int = 0


class Result(_Control):
    """The analyzer's published result of one round."""

    round_id: str
    k: int
    eps0: float
    batch_size: int
    histogram: list[int]
    estimate: list[float]
    stderr: list[float]
    estimator: str
    rejected: dict[str, int]
    privacy: dict[str, float | str | None] = Field(default_factory=dict)
    # iterative estimators (ibu): whether the fit met its tolerance, and after how many steps
    converged: bool | None = None
    iterations: int | None = None


class Ready(_Control):
    """Hop `hop` is subscribed to its input for this round and holds the announced key.

    Services answer the coordinator's prepare with it, so that the announcement reaches clients
    only once every hop listens (nothing a client sends can be missed). The coordinator is
    hop -1 in aborts it publishes itself.
    """

    round_id: str
    hop: int = Field(ge=0)
    key: str
