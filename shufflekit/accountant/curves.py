"""The curve cache: per-round privacy curves (PLDs, one-round epsilons, Rényi curves) and
composed totals, kept in memory and, through two callbacks, in the ledger's database, so that
`budget status` of a ledger with a thousand rounds answers from stored curves in about a second.

Every key names the engine and its version (`engine_version`: a digest of the accountant's
source code and of the numerical libraries it runs on) and the exact parameters, so a change of
the maths never serves a stale curve: old entries are simply never asked for again, and
committed rounds are recomposed with the current engine.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import math
import pathlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import scipy

from shufflekit.accountant.core import PrivacyLossDistribution
from shufflekit.accountant.curve_pld import CurvePLD, hull_pld
from shufflekit.accountant.rdp_filter import ORDERS, rdp_curve
from shufflekit.accountant.round_types import RoundType
from shufflekit.base.arrays import FloatArray

ENGINE = "tight+dp_accounting"
Charge = tuple[RoundType, int]  # a round's type and the population it is charged at
Load = Callable[[str], bytes | None]
Save = Callable[[str, bytes], None]


@functools.cache
def engine_version() -> str:
    """A digest of every accountant source file, numpy's and scipy's versions and
    dp_accounting's PLD sources: any change to the maths gives new cache keys."""
    h = hashlib.sha256()
    for path in sorted(pathlib.Path(__file__).parent.rglob("*.py")):
        if path.name.startswith("ledger"):
            continue  # the ledger's rules do not change a curve
        h.update(path.relative_to(pathlib.Path(__file__).parent).as_posix().encode())
        h.update(path.read_bytes())
    h.update(f"numpy={np.__version__} scipy={scipy.__version__}".encode())
    import dp_accounting  # here, not at the top: loading it takes ~1 s (scipy.signal)

    # dp_accounting has no version attribute: its PLD sources stand for it
    for path in sorted(pathlib.Path(dp_accounting.__file__).parent.joinpath("pld").glob("*.py")):
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def charges_digest(charges: Sequence[Charge]) -> str:
    """A digest of a multiset of charges (order does not matter to a composed total)."""
    items = sorted(f"{t.key()}|{n}" for t, n in charges)
    return hashlib.sha256("\n".join(items).encode()).hexdigest()[:32]


def pack_pld(p: PrivacyLossDistribution) -> bytes:
    """A PLD as bytes (numpy's npz, no pickle); an exact-curve upper side (`curve_pld.hull_pld`)
    with its hull values, so that it comes back with the same gridding."""
    buf = io.BytesIO()
    hull = p.hull if isinstance(p, CurvePLD) and p.upper else None
    extra: dict[str, Any] = {}  # (Any: numpy's stubs type ** as its `allow_pickle` flag)
    if hull is not None:
        extra = {"hull_at": np.array([hull[0], hull[1]]), "hull": hull[2]}
    np.savez_compressed(
        buf,
        losses=np.asarray(p.losses, dtype=np.float64),
        log_probs=np.asarray(p.log_probs, dtype=np.float64),
        log_inf_mass=np.array([p.log_inf_mass]),
        description=np.array([p.description]),
        **extra,
    )
    return buf.getvalue()


def unpack_pld(data: bytes) -> PrivacyLossDistribution:
    """Inverse of `pack_pld`."""
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        description = str(z["description"][0])
        if "hull" in z:
            base, first = z["hull_at"]
            return hull_pld(float(base), int(first), z["hull"], description)
        return PrivacyLossDistribution(
            losses=z["losses"],
            log_probs=z["log_probs"],
            log_inf_mass=float(z["log_inf_mass"][0]),
            description=description,
        )


class CurveCache:
    """Memory in front of an optional persistent store (`load`, `save`; the ledger's table).

    `computed` and `loaded` count what was computed afresh and what came from the store (tests
    check that the cache is used). A store that fails is ignored: the cache is only a cache.
    """

    def __init__(self, load: Load | None = None, save: Save | None = None) -> None:
        self._load, self._save = load, save
        self.memory: dict[str, Any] = {}
        self.computed = 0
        self.loaded = 0
        self.saving = True

    @contextlib.contextmanager
    def memory_only(self) -> Iterator[None]:
        """Within the block, store new curves in memory only (the caller holds the ledger's
        write lock: another write transaction would wait for it)."""
        before, self.saving = self.saving, False
        try:
            yield
        finally:
            self.saving = before

    def key(self, kind: str, *parts: object) -> str:
        """`kind|engine|version|parts...`."""
        return "|".join([kind, ENGINE, engine_version(), *map(str, parts)])

    def _get(
        self,
        key: str,
        compute: Callable[[], Any],
        pack: Callable[[Any], bytes],
        unpack: Callable[[bytes], Any],
    ) -> Any:
        if key in self.memory:
            return self.memory[key]
        data = self._load(key) if self._load is not None else None
        if data is not None:
            value = unpack(data)
            self.loaded += 1
        else:
            value = compute()
            self.computed += 1
            if self._save is not None and self.saving:
                self._save(key, pack(value))
        if len(self.memory) > 4096:
            self.memory.clear()
        self.memory[key] = value
        return value

    def pld(self, t: RoundType, n: int, compute: Callable[[], PrivacyLossDistribution]) -> Any:
        """The round's dominating pair at `n` users."""
        return self._get(self.key("pld", t.key(), n), compute, pack_pld, unpack_pld)

    def number(self, key: str, compute: Callable[[], float]) -> float:
        """A cached float (one-round epsilons, composed totals)."""
        return float(
            self._get(key, compute, lambda v: repr(float(v)).encode(), lambda b: float(b.decode()))
        )

    def rdp(
        self, t: RoundType, n: int, pld: Callable[[], PrivacyLossDistribution]
    ) -> tuple[FloatArray, float]:
        """The round's Rényi curve at `ORDERS` and its infinite-loss mass delta0."""

        def compute() -> tuple[FloatArray, float]:
            return rdp_curve(pld(), ORDERS)

        def pack(v: tuple[FloatArray, float]) -> bytes:
            rho = [x if math.isfinite(x) else None for x in v[0].tolist()]
            return json.dumps({"orders": ORDERS.tolist(), "rho": rho, "delta0": v[1]}).encode()

        def unpack(b: bytes) -> tuple[FloatArray, float]:
            d = json.loads(b)
            rho = np.array([math.inf if x is None else x for x in d["rho"]], dtype=np.float64)
            return rho, float(d["delta0"])

        key = self.key("rdp", t.key(), n, ",".join(f"{a:g}" for a in ORDERS))
        value: tuple[FloatArray, float] = self._get(key, compute, pack, unpack)
        return value
