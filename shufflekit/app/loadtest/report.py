"""The load test's report: one JSON object with the documented keys (`REPORT_KEYS`), built from
what the Locust users measured and what the services printed, and one self-contained HTML
page with plots (throughput over time, latency percentiles, round latency, stages)."""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPORT_KEYS = (
    "users_per_round",
    "rounds",
    "rounds_released",
    "reports_sent",
    "reports_acknowledged",
    "reports_receipted",
    "reports_counted",
    "reports_rejected",
    "reports_lost",
    "reports_unreceipted",  # beyond the list: given up without a receipt
    "rounds_aborted",  # beyond the list: each round not released, and why
    "throughput_reports_per_s",
    "publish_latency_ms",
    "puback_latency_ms",  # beyond the list: until the broker's PUBACK (the 2nd series)
    "round_latency_s",
    "stages_s",
    "crypto_floor_reports_per_s",
    "floor_ratio",
    "workers",
    "peak_rss_mb",
)
STAGES = ("encrypt", "publish", "peel", "forward", "analyze", "ledger")


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """p50, p95, p99 and max of `values` (None each when there are none)."""
    if not values:
        return {"p50": None, "p95": None, "p99": None, "max": None}
    a = np.asarray(values, dtype=float)
    p = np.percentile(a, [50, 95, 99])
    return {
        "p50": round(float(p[0]), 3),
        "p95": round(float(p[1]), 3),
        "p99": round(float(p[2]), 3),
        "max": round(float(a.max()), 3),
    }


@dataclass
class RoundFacts:
    """One round as the users and the services saw it."""

    index: int
    round_id: str
    sent: int = 0
    acked: int = 0
    acked_good: int = 0  # good reports sent before the close, acknowledged by the broker
    receipts: bool = False  # the round announced mix 0's receipt key: reports asked for one
    receipted: int = 0  # reports holding mix 0's verified receipt
    unreceipted: int = 0  # good reports sent before the close given up without a receipt
    resent: int = 0  # publishes again of reports still awaiting their receipt
    late: int = 0
    counted: int | None = None
    latency_s: float | None = None
    stages: dict[str, float] = field(default_factory=dict)
    rejected: dict[str, int] = field(default_factory=dict)
    abort: str | None = None  # why the round was not released (the coordinator's line)


@dataclass
class Latencies:
    """Every report's latency (ms): until mix 0's receipt, and until the broker's PUBACK."""

    receipt: list[float] = field(default_factory=list)
    puback: list[float] = field(default_factory=list)


def gather_rounds(
    users: list[dict[str, Any]], services: dict[str, list[dict[str, Any]]], workers: int
) -> tuple[list[RoundFacts], Latencies]:
    """Per-round facts from every user's summary and the services' JSON lines; and every
    report's latencies."""
    by_id: dict[str, RoundFacts] = {}
    first: dict[str, float] = {}
    last_result: dict[str, float] = {}
    first_send: dict[str, float] = {}
    last_ack: dict[str, float] = {}
    encrypt: dict[str, float] = {}
    latencies = Latencies()
    for u in users:
        for rid, st in u["rounds"].items():
            f = by_id.setdefault(rid, RoundFacts(st["round"], rid))
            f.sent += st["sent"]
            f.acked += st["acked"]
            f.acked_good += st["acked_good"]
            f.receipts = bool(st["receipts"])
            f.receipted += st["receipted"]
            f.unreceipted += st["unreceipted"]
            f.resent += st["resent"]
            f.late += st["late"]
            latencies.receipt.extend(st["receipt_ms"])
            latencies.puback.extend(st["puback_ms"])
            first[rid] = min(first.get(rid, st["announced"]), st["announced"])
            encrypt[rid] = encrypt.get(rid, 0.0) + st["encrypt_s"]
            if st["first_send"] is not None and st["sent"]:
                first_send[rid] = min(first_send.get(rid, st["first_send"]), st["first_send"])
                # the publish stage ends when the last report sent before the close is
                # delivered: receipted (or, without receipts, acknowledged by the broker)
                end = st["last_receipt"] if f.receipts else st["last_ack"]
                last_ack[rid] = max(last_ack.get(rid, 0.0), end)
            res = st.get("result")
            if res is not None:
                last_result[rid] = max(last_result.get(rid, 0.0), res["t"])
                if res.get("batch_size") is not None:
                    f.counted = int(res["batch_size"])
    for rid, f in by_id.items():
        if rid in last_result:
            f.latency_s = last_result[rid] - first[rid]
        f.stages["encrypt"] = encrypt.get(rid, 0.0) / max(workers, 1)
        if rid in first_send:
            f.stages["publish"] = max(last_ack[rid] - first_send[rid], 0.0)
        if f.late:
            f.rejected["late"] = f.late
    for name, lines in services.items():
        for line in lines:
            f2 = by_id.get(str(line.get("round_id")))
            if f2 is not None and name == "coordinator" and not line.get("released"):
                abort = line.get("abort") or {}
                f2.abort = str(abort.get("reason") or "not released")
            if f2 is None or name == "coordinator":
                continue
            for stage, sec in (line.get("stages") or {}).items():
                f2.stages[stage] = f2.stages.get(stage, 0.0) + float(sec)
            for reason, n in (line.get("rejected") or {}).items():
                f2.rejected[reason] = f2.rejected.get(reason, 0) + int(n)
    return sorted(by_id.values(), key=lambda f: f.index), latencies


def build_report(
    *,
    users_per_round: int,
    rounds: list[RoundFacts],
    latencies: Latencies,
    floor: float,
    workers: int,
    peak_rss_mb: dict[str, float],
) -> dict[str, Any]:
    """The report object, keys exactly `REPORT_KEYS`. With receipts (every round announced
    mix 0's receipt key), publish latency runs until the receipt and `reports_lost` counts
    receipted reports a released round did not count (an aborted round is refunded: nothing
    of it is lost); without, PUBACKs stand in for receipts."""
    released = [f for f in rounds if f.counted is not None]
    counted = sum(f.counted or 0 for f in released)
    wall = sum(f.latency_s for f in released if f.latency_s is not None)
    rejected: dict[str, int] = {}
    for f in rounds:
        for reason, n in f.rejected.items():
            rejected[reason] = rejected.get(reason, 0) + n
    stages = {
        s: (
            round(statistics.median(f.stages.get(s, 0.0) for f in rounds), 3)
            if rounds and any(s in f.stages for f in rounds)
            else None
        )
        for s in STAGES
    }
    throughput = counted / wall if wall > 0 else 0.0
    acked = sum(f.acked for f in rounds)
    receipts = bool(rounds) and all(f.receipts for f in rounds)
    delivered = [f.receipted if receipts else f.acked_good for f in rounds]
    out: dict[str, Any] = {
        "users_per_round": users_per_round,
        "rounds": len(rounds),
        "rounds_released": len(released),
        "reports_sent": sum(f.sent for f in rounds),
        "reports_acknowledged": acked,
        "reports_receipted": sum(delivered) if receipts else None,
        "reports_counted": counted,
        "reports_rejected": dict(sorted(rejected.items())),
        # per released round: delivered (receipted) beyond what its batch counted
        "reports_lost": sum(
            max(d - f.counted, 0)
            for d, f in zip(delivered, rounds, strict=True)
            if f.counted is not None
        ),
        "reports_unreceipted": sum(f.unreceipted for f in rounds) if receipts else None,
        "rounds_aborted": [
            {"round": f.index + 1, "round_id": f.round_id, "reason": f.abort or "no result"}
            for f in rounds
            if f.counted is None
        ],
        "throughput_reports_per_s": round(throughput, 1),
        "publish_latency_ms": percentiles(latencies.receipt if receipts else latencies.puback),
        "puback_latency_ms": percentiles(latencies.puback),
        "round_latency_s": percentiles([f.latency_s for f in rounds if f.latency_s is not None]),
        "stages_s": stages,
        "crypto_floor_reports_per_s": round(floor, 1),
        "floor_ratio": round(throughput / floor, 3) if floor > 0 else None,
        "workers": workers,
        "peak_rss_mb": peak_rss_mb,
    }
    assert tuple(out) == REPORT_KEYS
    return out


def _history(csv_path: Path) -> dict[str, tuple[list[float], dict[str, list[float]]]]:
    """Locust's per-second history by request name (and "Aggregated"): seconds since the
    load started, and the rate and percentile columns."""
    if not csv_path.exists():
        return {}
    rows = list(csv.DictReader(csv_path.open()))
    if not rows:
        return {}
    t0 = min(float(r["Timestamp"]) for r in rows)
    out: dict[str, tuple[list[float], dict[str, list[float]]]] = {}
    for name in {r.get("Name", "") for r in rows}:
        mine = [r for r in rows if r.get("Name") == name]
        cols = {}
        for c in ("Requests/s", "Total Request Count", "50%", "95%", "99%"):
            vals = [
                float(r[c]) if r.get(c) not in (None, "", "N/A") else float("nan") for r in mine
            ]
            if c.endswith("%"):  # no request in Locust's window: no percentile (not 0 ms)
                vals = [v if v > 0 else float("nan") for v in vals]
            cols[c] = vals
        out[name] = ([float(r["Timestamp"]) - t0 for r in mine], cols)
    return out


def per_second(t: list[float], total: list[float]) -> tuple[list[float], list[float]]:
    """The rate between consecutive rows of a running total, at each row's time, up to the
    last row where the total still grew. Locust's own "Requests/s" is averaged over its last
    seconds: it peaked at a fifth of the run's throughput and stayed up after the load ended."""
    last = max((i for i in range(1, len(t)) if total[i] > total[i - 1]), default=0)
    times, rates = [], []
    for i in range(1, last + 1):
        if t[i] > t[i - 1]:
            times.append(t[i])
            rates.append((total[i] - total[i - 1]) / (t[i] - t[i - 1]))
    return times, rates


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


# Locust's request names (locustfile.py): the receipt series (the main one), and the PUBACK
# series, drawn fainter; each with the percentiles shown and their colours
SERIES = (
    (
        "report (receipt)",
        "until mix 0's receipt",
        "-",
        (("50%", "#2ca02c"), ("95%", "#ff7f0e"), ("99%", "#d62728")),
    ),
    (
        "report (PUBACK)",
        "until the broker's PUBACK",
        "--",
        (("50%", "#7f7f7f"), ("99%", "#bcbcbc")),
    ),
)


def plots(report: dict[str, Any], rounds: list[RoundFacts], history: Path) -> list[tuple[str, str]]:
    """(title, base64 PNG) of the four plots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = []
    hist = _history(history)
    series = [(hist[name], label, ls, pcts) for name, label, ls, pcts in SERIES if name in hist]
    fig, ax = plt.subplots(figsize=(7, 3))
    for (t, cols), label, ls, _ in series:
        tt, rate = per_second(t, cols["Total Request Count"])
        ax.plot(tt, rate, ls=ls, color="#1f77b4", label=f"reports/s {label}")
    if series:
        ax.legend(fontsize=8)
    ax.set_xlabel("seconds since the load started")
    ax.set_ylabel("reports / s")
    ax.set_title("Throughput over time (reports done each second, until the load ended)")
    ax.grid(alpha=0.3)
    out.append(("Throughput over time", _png(fig)))
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 3.6))
    for (t, cols), label, ls, pcts in series:
        for c, color in pcts:
            ax.plot(t, cols[c], ls=ls, color=color, label=f"p{c[:-1]} {label}")
    if series:
        ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    ax.set_yscale("log")
    ax.set_xlabel("seconds since the load started")
    ax.set_ylabel("ms")
    ax.set_title(
        "Publish latency (Locust's running percentiles, 2 significant digits): until mix 0's "
        "receipt, and the PUBACK (dashed)",
        fontsize=9,
    )
    ax.grid(alpha=0.3, which="both")
    out.append(("Publish latency", _png(fig)))
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 3))
    idx = [f"round {f.index + 1}" for f in rounds]
    ax.bar(idx, [f.latency_s or 0 for f in rounds], color="#9467bd")
    floor = report["crypto_floor_reports_per_s"]
    if floor:
        users = report["users_per_round"]
        label = f"crypto floor for {users:,} reports: {users / floor:.2f} s"
        ax.axhline(users / floor, color="k", ls="--", label=label)
        ax.legend()
    ax.set_ylabel("seconds, announcement to result")
    ax.set_title("Round latency")
    out.append(("Round latency", _png(fig)))
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 3))
    names = [s for s in STAGES if report["stages_s"].get(s) is not None]
    ax.barh(names, [report["stages_s"][s] for s in names], color="#8c564b")
    ax.invert_yaxis()
    ax.set_xlabel("wall seconds per round (median over rounds; stages overlap)")
    ax.set_title("Where a round's time goes")
    out.append(("Stages", _png(fig)))
    plt.close(fig)
    return out


def _table(obj: dict[str, Any]) -> str:
    rows = "".join(
        f"<tr><th>{html.escape(k)}</th><td><code>{html.escape(json.dumps(v))}</code></td></tr>"
        for k, v in obj.items()
    )
    return f"<table>{rows}</table>"


def write_html(
    path: Path, report: dict[str, Any], rounds: list[RoundFacts], history: Path, notes: list[str]
) -> None:
    """One self-contained page (plots embedded as PNG) people can read and mail around."""
    r = report["reports_receipted"]
    receipted = "no receipts (PUBACKs only)" if r is None else f"{r:,} receipted by mix 0"
    plural = "s" * (report["rounds"] != 1)
    head = (
        f"{report['users_per_round']:,} users x {report['rounds']} round{plural}: "
        f"{report['rounds_released']} released, {receipted}, "
        f"{report['reports_counted']:,} counted, {report['reports_lost']} lost; "
        f"{report['throughput_reports_per_s']:,} reports/s = "
        f"{report['floor_ratio']} of the crypto floor "
        f"({report['crypto_floor_reports_per_s']:,} reports/s)"
    )
    figs = "".join(
        f'<figure><img alt="{html.escape(t)}" src="data:image/png;base64,{b}"></figure>'
        for t, b in plots(report, rounds, history)
    )
    per_round = "".join(
        f"<tr><td>{f.index + 1}</td><td>{html.escape(f.round_id)}</td><td>{f.sent:,}</td>"
        f"<td>{f.acked:,}</td><td>{f'{f.receipted:,}' if f.receipts else '-'}</td>"
        f"<td>{f.resent:,}</td><td>{'-' if f.counted is None else f'{f.counted:,}'}</td>"
        f"<td>{html.escape(json.dumps(f.rejected))}"
        f"{'' if f.abort is None else '<br>not released: ' + html.escape(f.abort)}</td>"
        f"<td>{'-' if f.latency_s is None else f'{f.latency_s:.2f}'}</td></tr>"
        for f in rounds
    )
    note_html = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    page = f"""<!doctype html><html><head><meta charset="utf-8">
<title>shufflekit load test</title><style>
body{{font-family:system-ui,sans-serif;max-width:980px;margin:2em auto;color:#222}}
h1{{font-size:1.4em}} .lead{{font-size:1.1em;background:#f4f6f8;padding:.8em;border-radius:6px}}
table{{border-collapse:collapse;margin:1em 0}} td,th{{border:1px solid #ccc;padding:.3em .6em;
text-align:left;font-size:.9em}} figure{{margin:1em 0}} img{{max-width:100%}}
</style></head><body>
<h1>shufflekit load test</h1><p class="lead">{html.escape(head)}</p>
<ul>{note_html}</ul>
{figs}
<h2>Rounds</h2><table><tr><th>#</th><th>round id</th><th>sent</th><th>acknowledged</th>
<th>receipted</th><th>resent</th><th>counted</th><th>rejected</th><th>latency (s)</th></tr>
{per_round}</table>
<h2>report.json</h2>{_table(report)}
</body></html>"""
    path.write_text(page)
