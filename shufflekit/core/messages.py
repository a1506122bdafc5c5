"""Control messages (JSON validated by pydantic): announce, close, manifest, abort, result.

Anyone who can publish on a topic can send a control message, so every field is checked before
use: finite numbers only, names in the topic-safe character set, bounded sizes. A message that
fails is refused whole with InvalidReport('bad_control'), which the reader counts.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from shufflekit.base.clock import Clock, system_clock
from shufflekit.base.errors import InvalidReport

PROTOCOL_VERSION = 1
MAX_CONTROL_BYTES = 4 * 1024 * 1024  # the largest result (k = 65535, three vectors) fits
MAX_HOPS = 16  # mixes in one cascade
MAX_REASON = 500  # characters of a free-text reason

# Names travel in topics and in the HPKE info string: the same set as core.topics.check_name.
Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
Key = Annotated[str, StringConstraints(min_length=1, max_length=256)]
Text = Annotated[str, StringConstraints(max_length=MAX_REASON)]


class _Control(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    version: int = PROTOCOL_VERSION

    def to_bytes(self) -> bytes:
        """Compact JSON for the wire."""
        return self.model_dump_json().encode()

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
            raise InvalidReport("bad_control", f"invalid {cls.__name__}: {exc}") from None
        if msg.version != PROTOCOL_VERSION:
            raise InvalidReport("bad_version", f"{cls.__name__} version {msg.version}")
        return msg


class Announcement(_Control):
    """Round R is open: its parameters and the public keys to encrypt to (mix 0 first)."""

    deployment: Name
    round_id: Name
    k: int = Field(ge=2, le=65535)
    eps0: float = Field(gt=0, lt=710)  # exp(eps0) must be a finite float
    n_min: int = Field(ge=1)
    deadline: float = Field(gt=0)  # unix time after which mix 0 stops accepting
    mix_keys: list[Key] = Field(min_length=1, max_length=MAX_HOPS)
    analyzer_key: Key

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
    hop: int = Field(ge=-1, le=MAX_HOPS)
    reason: Text
    received: int = Field(default=0, ge=0)


class Result(_Control):
    """The analyzer's published result of one round."""

    round_id: Name
    k: int = Field(ge=2, le=65535)
    eps0: float = Field(gt=0, lt=710)
    batch_size: int = Field(ge=0)
    histogram: list[Annotated[int, Field(ge=0)]] = Field(max_length=65535)
    estimate: list[float] = Field(max_length=65535)
    stderr: list[float] = Field(max_length=65535)
    estimator: Name
    rejected: dict[Name, Annotated[int, Field(ge=0)]] = Field(max_length=256)
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

    round_id: Name
    hop: int = Field(ge=0, le=MAX_HOPS)
    key: Key
