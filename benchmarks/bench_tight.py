"""Benchmark: one round of `tight` (upper bound and attack lower bound) at n = 10^6 and 10^7.

Setting of the issue: k = 10, eps0 = 4, delta = 1e-6; targets about one second at n = 10^6 and
a few seconds at n = 10^7 on one core. Times `accountant.tight.tight_epsilon` (what
`shufflekit privacy epsilon` and the ledger evaluate for one round), split into the upper bound
and the attack, as medians of cold-ish repeated calls (nothing is cached between calls but
the small-n dense laws, unused here), and as ratios to references timed in the same run on
the same machine: scipy's `binom.logpmf` over n + 1 points, and one numpy real FFT of n points.

Run: .venv/bin/python benchmarks/bench_tight.py [--repeats R]
"""

from __future__ import annotations

import argparse
import hashlib
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import scipy
from _timing import load_line, median_seconds
from scipy.stats import binom

from shufflekit.accountant import tight
from shufflekit.accountant.core import Mechanism, PrivacyResult

TIGHT_SHA = hashlib.sha256(Path(tight.__file__).read_bytes()).hexdigest()[:12]

K, EPS0, DELTA = 10, 4.0, 1e-6
SIZES = (1_000_000, 10_000_000)
TARGET_SECONDS = {1_000_000: 1.0, 10_000_000: 5.0}  # "about a second", "a few seconds"
RESULTS = Path(__file__).resolve().parent / "results" / "tight.txt"


def time_tight(mech: Mechanism, repeats: int) -> tuple[float, float, float, PrivacyResult]:
    """(median total, median upper, median lower) seconds of tight_epsilon, and one result."""
    tight.tight_epsilon(Mechanism(1000, mech.k, mech.eps0), DELTA)  # warm imports and code paths
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        res = tight.tight_epsilon(mech, DELTA)
        runs.append((time.perf_counter() - start, res))
    total = statistics.median(r[0] for r in runs)
    upper = statistics.median(float(r[1].details["seconds_upper"]) for r in runs)
    lower = statistics.median(float(r[1].details["seconds_lower"]) for r in runs)
    return total, upper, lower, runs[0][1]


def main(argv: list[str] | None = None) -> str:
    """Time every size, write the report, and return it."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per size (median)")
    args = ap.parse_args(argv)
    p_keep = Mechanism(10, K, EPS0).p_keep
    lines = [
        f"tight, one round: k = {K}, eps0 = {EPS0:g}, delta = {DELTA:g} "
        f"(accountant.tight.tight_epsilon, median of {args.repeats})",
        f"machine: {platform.machine()}, python {platform.python_version()}, "
        f"numpy {np.__version__}, scipy {scipy.__version__}",
        load_line(),
        f"shufflekit/accountant/tight.py sha256 {TIGHT_SHA}",
        "",
    ]
    for n in SIZES:
        mech = Mechanism(n, K, EPS0)
        total, upper, lower, res = time_tight(mech, args.repeats)
        pts = np.arange(n + 1, dtype=np.float64)
        ref_logpmf = median_seconds(lambda: binom.logpmf(pts, n, p_keep), 5)  # noqa: B023
        x = np.random.default_rng(0).random(n)
        ref_fft = median_seconds(lambda: np.fft.irfft(np.fft.rfft(x), n=n), 5)  # noqa: B023
        low = res.lower_epsilon or 0.0
        gap = res.epsilon / low - 1 if low > 0 else float("inf")
        target = TARGET_SECONDS[n]
        lines += [
            f"n = {n:.0e}: epsilon {res.epsilon:.6g} (lower bound {low:.6g}, gap {gap:.3%}; "
            f"worst dataset: {res.details['worst_dataset']})",
            f"  tight_epsilon        {total:8.3f} s  (upper {upper:.3f} s, "
            f"{res.details['upper_evaluations']} evaluations over "
            f"{res.details['blanket_elements']} elements; lower {lower:.3f} s, "
            f"{res.details['lower_evaluations']} evaluations)",
            f"  ref: binom.logpmf over n+1 points  {ref_logpmf:.4f} s  -> tight / ref = "
            f"{total / ref_logpmf:.1f}",
            f"  ref: numpy rfft+irfft of n points  {ref_fft:.4f} s  -> tight / ref = "
            f"{total / ref_fft:.1f}",
            f"  target (about {target:g} s): {'met' if total <= target else 'MISSED'}",
            "",
        ]
    report = "\n".join(lines)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(report, encoding="utf-8")
    return report


if __name__ == "__main__":
    sys.stdout.write(main())
