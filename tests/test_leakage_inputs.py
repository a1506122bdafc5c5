"""The leakage functions take numpy numbers as every other entry point does, and refuse a bool,
a float count, a string or a bad `insider_work` / `max_excess` by name (InvalidParameters)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from shufflekit.accountant import leakage as lk
from shufflekit.accountant import leakage_report, min_cohort
from shufflekit.base.errors import InvalidParameters


def test_numpy_numbers_give_the_same_report_with_plain_fields() -> None:
    plain = leakage_report(n=1000, k=2, eps0=1.0)
    r = leakage_report(n=np.int64(1000), k=np.int32(2), eps0=np.float64(1.0))
    assert r == plain
    assert type(r.n) is int and type(r.k) is int and type(r.eps0) is float
    assert min_cohort(k=np.int64(2), eps0=np.float32(1.0), max_excess=np.float64(0.01)) == 340


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: leakage_report(n=True, k=2, eps0=1.0), "n"),
        (lambda: leakage_report(n=1e3, k=2, eps0=1.0), "n"),
        (lambda: leakage_report(n=1000, k=2.0, eps0=1.0), "k"),
        (lambda: leakage_report(n=1000, k=2, eps0="1"), "eps0"),
        (lambda: leakage_report(n=1000, k=3, eps0=1.0, insider_work="x"), "insider_work"),
        (lambda: leakage_report(n=1000, k=3, eps0=1.0, insider_work=float("nan")), "insider_work"),
        (lambda: leakage_report(n=1000, k=3, eps0=1.0, insider_work=-1), "insider_work"),
        (lambda: min_cohort(k=2, eps0=1.0, max_excess="0.01"), "max_excess"),
        (lambda: lk.outsider_vulnerability(10, 2, True), "eps0"),
    ],
)
def test_bad_values_are_refused_by_name(call: Callable[[], Any], name: str) -> None:
    with pytest.raises(InvalidParameters, match=f"^{name}"):
        call()
