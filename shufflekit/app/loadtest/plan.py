"""What each simulated client does in each round, the same in every Locust worker and in the
harness (which needs the expected counts): a seeded draw of dropouts, stragglers, bad reports,
values and arrival times; and the load test's settings, handed to the workers as a JSON file."""

from __future__ import annotations

import json
import math
import os
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shufflekit.base.errors import ConfigError

GOOD, DROPOUT, STRAGGLER, BAD = 0, 1, 2, 3
MAX_USERS = 10_000_000  # users a round one machine's load test plans (O(users) per connection)
PLAN_ENV = "SHUFFLEKIT_LOADTEST_PLAN"  # path of the JSON settings file the workers read
BAD_KINDS = ("tampered", "truncated", "random", "foreign")


def connection_id(slot: int) -> str:
    """The MQTT client id of the load generator's connection `slot`, also its receipt reply id
    (the ACL's `%c`). It starts `sk-`, as the shipped broker requires of every connection
    (`clientid_prefixes sk-` in deploy/mosquitto/mosquitto.conf)."""
    return f"sk-lt-{uuid.uuid4().hex[:12]}-{slot}"


@dataclass(frozen=True)
class LoadSettings:
    """Everything a Locust worker needs: the broker, the deployment and the load's shape."""

    host: str
    port: int
    tls: bool
    ca_file: str | None
    username: str | None
    password: str | None
    deployment: str
    users: int
    rounds: int
    connections: int
    ramp: float = 0.0
    dropout: float = 0.0
    stragglers: float = 0.0
    bad_fraction: float = 0.0
    seed: int = 0
    in_flight: int = 200  # publishes of one connection awaiting the broker's PUBACK
    window: int = 300  # reports of one connection awaiting mix 0's receipt
    enrollment_key: str | None = None  # base64 private key: the workers issue credentials
    out_dir: str = "."

    def __post_init__(self) -> None:
        for name in ("dropout", "stragglers", "bad_fraction"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ConfigError(f"--{name.replace('_', '-')} must be in [0, 1], got {v}")
        if self.users < 1 or self.rounds < 1 or self.connections < 1:
            raise ConfigError("--users, --rounds and the connections must be at least 1")
        fractions = self.dropout + self.stragglers + self.bad_fraction
        if fractions >= 1.0 or self.counts()["good"] < 1:  # the latter after rounding
            raise ConfigError(
                f"with {self.users:,} users, dropouts, stragglers and bad reports leave no good "
                "client"
            )
        if self.users > MAX_USERS:
            raise ConfigError(
                f"--users must be at most {MAX_USERS:,} a round here (each connection plans "
                "every user); deploy/loadtest.md spreads more over several hosts"
            )
        if not 0 <= self.ramp < math.inf:
            raise ConfigError("--ramp must be a finite number of seconds >= 0")

    def write(self, path: Path) -> None:
        """Save for the workers (mode 0600: it may hold the broker password)."""
        path.write_text(json.dumps(asdict(self)))
        path.chmod(0o600)

    @classmethod
    def from_env(cls) -> LoadSettings:
        """The settings the harness wrote, at the path in $SHUFFLEKIT_LOADTEST_PLAN."""
        path = os.environ.get(PLAN_ENV)
        if not path:
            raise ConfigError(f"{PLAN_ENV} is not set: run the load through `shufflekit loadtest`")
        data: dict[str, Any] = json.loads(Path(path).read_text())
        return cls(**data)

    def counts(self) -> dict[str, int]:
        """How many clients of a round drop out, straggle, send bad or good reports."""
        drop = round(self.dropout * self.users)
        strag = round(self.stragglers * self.users)
        bad = round(self.bad_fraction * self.users)
        return {
            "dropout": drop,
            "straggler": strag,
            "bad": bad,
            "good": self.users - drop - strag - bad,
        }


@dataclass(frozen=True)
class RoundPlan:
    """Round `r`'s draw: `role[j]`, `value[j]` and `offset[j]` (seconds after the
    announcement) of client j."""

    role: np.ndarray
    value: np.ndarray
    offset: np.ndarray


def round_plan(s: LoadSettings, r: int, k: int) -> RoundPlan:
    """The seeded draw of round `r` (exact counts from `LoadSettings.counts`)."""
    rng = np.random.default_rng([s.seed, r])
    c = s.counts()
    roles = np.full(s.users, GOOD, dtype=np.int8)
    perm = rng.permutation(s.users)
    a = c["dropout"]
    b = a + c["straggler"]
    roles[perm[:a]] = DROPOUT
    roles[perm[a:b]] = STRAGGLER
    roles[perm[b : b + c["bad"]]] = BAD
    values = rng.integers(0, k, size=s.users)
    offsets = rng.uniform(0.0, s.ramp, size=s.users) if s.ramp > 0 else np.zeros(s.users)
    return RoundPlan(roles, values, offsets)


def clients_of(s: LoadSettings, slot: int) -> range:
    """The logical clients connection `slot` carries: j = slot, slot + C, slot + 2C, ..."""
    return range(slot, s.users, s.connections)
