"""Service configuration: one TOML file per deployment (or per service), environment overrides.

Every service reads the same model; each uses its own section. Environment variables override
the file: `SHUFFLEKIT_BROKER`, `SHUFFLEKIT_DEPLOYMENT`, nested ones with `__`
(`SHUFFLEKIT_COORDINATOR__N_MIN=500`). Relative paths are taken from the config file's folder,
so a unit file or a container can start the service from anywhere. Any mistake is one
`ConfigError` naming the field, the problem and the file.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from shufflekit.accountant.core import EPS0_MAX, EPS0_MIN
from shufflekit.analyzer.names import ESTIMATORS
from shufflekit.app.rounds import RoundParams
from shufflekit.app.services.keys import KeyFiles
from shufflekit.app.services.metrics import MetricsSettings
from shufflekit.base.errors import ConfigError
from shufflekit.core.topics import check_name
from shufflekit.core.transport.mqtt import BrokerAddress
from shufflekit.core.wire import MAX_RECORD_BITS

ENV_PREFIX = "SHUFFLEKIT_"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MixSettings(_Section):
    """`[mix]`: what every mix uses; `index` may instead come from `serve mix --index`."""

    index: int | None = Field(default=None, ge=0, description="this mix's place in the cascade")
    private_key: Path | None = Field(default=None, description="default: {keys_dir}/mix{index}.key")
    batch_timeout: float = Field(
        default=60.0, gt=0, description="seconds past the deadline for a batch"
    )
    per_chunk: int = Field(
        default=500, ge=1, le=20_000, description="reports per forwarded MQTT message"
    )
    enrollment_key: Path | None = Field(
        default=None,
        description="mix 0: enrollment public key; every report then needs a valid credential",
    )
    peel_workers: int = Field(
        default=2,
        ge=0,
        le=256,
        description="worker processes that peel reports as they arrive (0: in the service)",
    )
    spool_round_bytes: int = Field(
        default=1 << 30,
        ge=1024,
        description="input bytes the spool keeps for one round; a report past it is refused",
    )
    spool_total_bytes: int = Field(
        default=4 << 30,
        ge=1024,
        description="input bytes the spool keeps for all rounds; a report past it is refused",
    )


class AnalyzerSettings(_Section):
    """`[analyzer]`: its key, estimator and batch timeout (the ledger is the top-level one)."""

    private_key: Path | None = Field(default=None, description="default: {keys_dir}/analyzer.key")
    estimator: str = "inv"
    batch_timeout: float = Field(default=60.0, gt=0)

    @field_validator("estimator")
    @classmethod
    def _known_estimator(cls, v: str) -> str:
        if v not in ESTIMATORS:
            raise ValueError(f"unknown estimator {v!r}; choose one of {', '.join(ESTIMATORS)}")
        return v


class CoordinatorSettings(_Section):
    """`[coordinator]`: the rounds it runs and where the others' public keys are."""

    k: int | None = Field(default=None, ge=2, le=65535, description="categories (k-RR)")
    eps0: float = Field(
        ge=EPS0_MIN, le=EPS0_MAX, allow_inf_nan=False, description="local epsilon per report"
    )
    mechanism: Literal["krr", "bits"] = Field(
        default="krr", description="krr (k-RR over k values) or bits (L-bit records)"
    )
    bits: int | None = Field(
        default=None, ge=1, le=MAX_RECORD_BITS, description="bits per record L (mechanism bits)"
    )
    n_min: int | None = Field(default=None, ge=1, description="default: the budget's n_min")
    deadline: float = Field(default=60.0, gt=0, description="seconds clients have to answer")
    close_at: int | None = Field(
        default=None,
        ge=1,
        description="close ingest early once this many accepted reports are stored",
    )
    interval: float = Field(default=5.0, ge=0, description="seconds between rounds")
    ready_timeout: float = Field(
        default=30.0, gt=0, description="seconds for every hop to be ready"
    )
    batch_timeout: float = Field(default=60.0, gt=0)
    lease: float = Field(
        default=15.0,
        ge=1,
        le=600,
        description="seconds its lease in the ledger lasts unrenewed (one coordinator per "
        "deployment; a restart after a crash waits up to this long)",
    )
    mix_public_keys: list[Path] | None = Field(
        default=None, description="default: {keys_dir}/mix{i}.pub"
    )
    analyzer_public_key: Path | None = Field(
        default=None, description="default: {keys_dir}/analyzer.pub"
    )

    @model_validator(mode="after")
    def _mechanism_complete(self) -> Self:
        if self.mechanism == "krr" and (self.k is None or self.bits is not None):
            raise ValueError("mechanism krr needs k (and no bits)")
        if self.mechanism == "bits" and (
            self.bits is None or (self.k is not None and self.k != 1 << self.bits)
        ):
            raise ValueError("mechanism bits needs bits = L (k, if given, must be 2^L)")
        return self

    def round_params(self, n_min: int) -> RoundParams:
        """The rounds' parameters, with `n_min` when the section does not set its own."""
        n = self.n_min or n_min
        if self.mechanism == "bits" and self.bits is not None:
            return RoundParams.for_bits(self.bits, self.eps0, n, self.deadline, self.close_at)
        return RoundParams(
            int(self.k or 0), self.eps0, n, deadline_seconds=self.deadline, close_at=self.close_at
        )


class ServiceConfig(BaseSettings):
    """The whole file. Top level: broker, deployment, cascade length, folders, ledger."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid"
    )

    broker: str = Field(description="mqtt://host:port or mqtts://user:pass@host:port")
    deployment: str
    mixes: int = Field(ge=1, le=16, description="cascade length L")
    keys_dir: Path = Path("keys")
    state_dir: Path = Path(".shufflekit")
    ledger: str | None = Field(default=None, description="default: SQLite in state_dir")
    client_id_prefix: str = Field(
        default="shufflekit",
        pattern=r"^[A-Za-z0-9_.-]{1,32}$",
        description="MQTT client ids are {prefix}-{deployment}-{role}: fixed, for durable sessions",
    )
    session_expiry: int = Field(
        default=86_400,
        ge=0,
        description="seconds the broker keeps a service's session and queued messages while away",
    )
    mix: MixSettings = MixSettings()
    analyzer: AnalyzerSettings = AnalyzerSettings()
    coordinator: CoordinatorSettings | None = None
    metrics: MetricsSettings = MetricsSettings()  # services/metrics.py

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The environment wins over the file's values (which arrive as init values)."""
        return (env_settings, init_settings)

    @field_validator("broker")
    @classmethod
    def _broker_url(cls, v: str) -> str:
        try:
            BrokerAddress.parse(v)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return v

    @field_validator("deployment")
    @classmethod
    def _deployment_name(cls, v: str) -> str:
        try:
            return check_name("deployment", v)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None

    # ------------------------------------------------------------------ derived values
    def ledger_url(self) -> str:
        """The ledger the coordinator reserves in and the analyzer commits to."""
        return self.ledger or f"sqlite:///{self.state_dir / 'ledger.db'}"

    def client_id(self, role: str) -> str:
        """The fixed MQTT client id of a role (`mix0`, `analyzer`, `coordinator`): the broker
        finds the service's persistent session under it after a restart."""
        return f"{self.client_id_prefix}-{self.deployment}-{role}"

    def spool_path(self, role: str) -> Path:
        """The SQLite spool of a mix or the analyzer (what it accepted, where each round is)."""
        return self.state_dir / f"spool-{role}.db"

    def mix_index(self, index: int | None) -> int:
        """The mix index from the command line or `[mix] index`, checked against `mixes`."""
        i = index if index is not None else self.mix.index
        if i is None:
            raise ConfigError("which mix? pass --index I or set `index` in [mix]")
        if not 0 <= i < self.mixes:
            raise ConfigError(f"mix index {i} is outside the cascade of {self.mixes} mixes")
        return i

    def mix_private_key(self, index: int) -> Path:
        """The private key file of mix `index`."""
        return self.mix.private_key or KeyFiles.of(self.keys_dir, f"mix{index}").private

    def analyzer_private_key(self) -> Path:
        """The analyzer's private key file."""
        return self.analyzer.private_key or KeyFiles.of(self.keys_dir, "analyzer").private

    def coordinator_settings(self) -> CoordinatorSettings:
        """The `[coordinator]` section; ConfigError if the file has none."""
        if self.coordinator is None:
            raise ConfigError("the configuration has no [coordinator] section (k, eps0, ...)")
        return self.coordinator

    def public_keys(self) -> tuple[list[Path], Path]:
        """The coordinator's view: every mix's public key file and the analyzer's."""
        c = self.coordinator_settings()
        mixes = c.mix_public_keys or [
            KeyFiles.of(self.keys_dir, f"mix{i}").public for i in range(self.mixes)
        ]
        if len(mixes) != self.mixes:
            raise ConfigError(
                f"[coordinator] mix_public_keys names {len(mixes)} files for {self.mixes} mixes"
            )
        return mixes, c.analyzer_public_key or KeyFiles.of(self.keys_dir, "analyzer").public

    def _resolved(self, base: Path) -> ServiceConfig:
        """Relative paths (and a relative SQLite ledger) taken from `base`."""

        def r(p: Path | None) -> Path | None:  # an absolute path is used as given
            return None if p is None else p if p.is_absolute() else base / p

        upd: dict[str, Any] = {
            "keys_dir": r(self.keys_dir),
            "state_dir": r(self.state_dir),
            "mix": self.mix.model_copy(
                update={
                    "private_key": r(self.mix.private_key),
                    "enrollment_key": r(self.mix.enrollment_key),
                }
            ),
            "analyzer": self.analyzer.model_copy(
                update={"private_key": r(self.analyzer.private_key)}
            ),
        }
        upd = {k: v for k, v in upd.items() if v is not None}
        if self.coordinator is not None:
            c = self.coordinator
            upd["coordinator"] = c.model_copy(
                update={
                    "mix_public_keys": (
                        [base / p if not p.is_absolute() else p for p in c.mix_public_keys]
                        if c.mix_public_keys
                        else None
                    ),
                    "analyzer_public_key": r(c.analyzer_public_key),
                }
            )
        if self.ledger and self.ledger.startswith("sqlite:///"):
            path = Path(self.ledger.removeprefix("sqlite:///"))
            if not path.is_absolute():
                upd["ledger"] = f"sqlite:///{base / path}"
        return self.model_copy(update=upd)


def load_config(path: Path) -> ServiceConfig:
    """Read and validate a service configuration file (environment overrides applied)."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read configuration {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    try:
        cfg = ServiceConfig(**data)
    except ValidationError as exc:
        raise ConfigError(
            f"invalid configuration {path} (or {ENV_PREFIX}* environment): {_explain(exc)}"
        ) from None
    return cfg._resolved(path.resolve().parent)


def _explain(exc: ValidationError) -> str:
    """Every problem, `section.field: what is wrong (got value)`, separated by "; " (the CLI
    prints an error in one line)."""
    lines = []
    for e in exc.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown setting (check its spelling and section)"
        got = f" (got {e['input']!r})"
        if e["type"] in ("missing", "extra_forbidden") or where == "broker" or got[6:-1] in msg:
            got = ""  # nothing to show, already shown, or a URL that may hold a password
        lines.append(f"{where}: {msg}{got}")
    return "; ".join(lines)
