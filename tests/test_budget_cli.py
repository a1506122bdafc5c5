"""`shufflekit budget init --mode/--round-type`, `status` naming the whole policy and each
quantity, and `delete` (asks, --yes, refused with committed rounds unless --force)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner, Result

from shufflekit.accountant.ledger import Budget, Ledger
from shufflekit.app.cli import app
from tests.cli_run import run_cli_tty


def budget(args: list[str], state: Path, stdin: str | None = None) -> Result:
    """`shufflekit budget ARGS` in this process, with its default ledger under `state`."""
    return CliRunner().invoke(
        app, ["budget", *args], env={"SHUFFLEKIT_STATE": str(state)}, input=stdin
    )


INIT = ["init", "--epsilon", "5", "--delta", "1e-6", "--n-min", "10", "--cost-model", "ldp"]


def test_planned_init_with_a_schedule_and_the_status_policy(tmp_path: Path) -> None:
    r = budget([*INIT, "--round-type", "10,2,2", "--round-type", "4,1", "--json"], tmp_path)
    assert r.exit_code == 0, r.output
    made = json.loads(r.stdout)
    assert made["mode"] == "planned" and [e["count"] for e in made["schedule"]] == [2, None]
    led = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}", create=False)
    led.reserve("default", "r1", 10, 2.0)
    led.commit("default", "r1", 12)
    led.reserve("default", "r2", 10, 2.0)
    st = json.loads(budget(["status", "--json"], tmp_path).stdout)
    assert (st["epsilon_committed"], st["epsilon_spent_or_reserved"]) == (2.0, 4.0)
    assert st["epsilon_reserved_increment"] == 2.0 and st["epsilon_remaining"] == 1.0
    assert "epsilon_reserved" not in st and "epsilon_spent" not in st  # no ambiguous names
    policy = st["policy"]
    assert (policy["n_min"], policy["max_corrupt"], policy["max_round_epsilon"]) == (10, 0, None)
    assert policy["reservation_ttl"] is None and "summing eps0" in st["guarantee"]
    text = budget(["status"], tmp_path).stdout
    for words in (
        "n_min 10",
        "max_corrupt 0",
        "per-round cap none",
        "reservation TTL none",
        "schedule: 2 x 10,2 then 4,1 from then on",
        "mode planned",
        "open reservations add 2",
        "guarantee:",
    ):
        assert words in " ".join(text.split()), (words, text)


def test_bad_round_types_and_modes_are_one_line_errors(tmp_path: Path) -> None:
    for extra in (
        ["--round-type", "10"],
        ["--round-type", "4,1", "--round-type", "4,2,1"],
        ["--mode", "sometimes"],
        ["--mode", "adaptive", "--round-type", "4,1"],
        ["--round-type", "bits:0,1"],
    ):
        r = budget([*INIT, *extra], tmp_path)
        assert r.exit_code == 2 and "Traceback" not in r.output, (extra, r.output)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "ledger.db").exists()  # nothing created


def test_delete_asks_and_refuses_committed_rounds_unless_forced(tmp_path: Path) -> None:
    assert budget([*INIT, "--mode", "adaptive"], tmp_path).exit_code == 0
    r = budget(["delete"], tmp_path, stdin="n\n")
    assert r.exit_code == 2 and "not deleted" in r.stderr
    r = budget(["delete"], tmp_path, stdin="")  # no answer (a script, stdin closed)
    assert r.exit_code == 2 and r.stderr.strip().splitlines()[-1:] == [
        "error: no answer to the confirmation: not deleted; add --yes to delete without asking"
    ], r.output
    led = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}", create=False)
    led.reserve("default", "r1", 4, 1.0)
    led.commit("default", "r1", 12)
    r = budget(["delete", "--yes"], tmp_path)
    assert r.exit_code == 2 and "--force" in r.stderr and led.has_budget("default")
    r = budget(["delete"], tmp_path, stdin="y\n")  # refused before asking, not after a "y"
    assert r.exit_code == 2 and "--force" in r.stderr and "Delete the budget" not in r.output
    r = budget(["delete", "--yes", "--force", "--json"], tmp_path)
    assert r.exit_code == 0 and json.loads(r.stdout)["rounds_deleted"] == 1
    assert not led.has_budget("default")
    assert budget([*INIT], tmp_path).exit_code == 0  # the name is free again
    r = budget(["delete"], tmp_path, stdin="y\n")
    assert r.exit_code == 0 and "deleted the budget of 'default'" in r.stdout


async def test_rounds_lists_running_and_recent_with_the_broker_announcement(
    tmp_path: Path,
) -> None:
    from shufflekit.app.cli_round_list import announced_round, listing
    from shufflekit.core.messages import Announcement
    from shufflekit.core.topics import Topics
    from shufflekit.core.transport import MemoryBroker

    assert budget([*INIT, "--mode", "adaptive"], tmp_path).exit_code == 0
    led = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}", create=False)
    for rid in ("r1", "r2", "r3"):
        led.reserve("default", rid, 4, 1.0)
    led.commit("default", "r1", 12)
    led.refund("default", "r2")
    broker = MemoryBroker()
    ann = Announcement(
        deployment="default",
        round_id="r3",
        k=4,
        eps0=1.0,
        n_min=10,
        deadline=1e10,
        mix_keys=["a"],
        analyzer_key="b",
    )
    async with broker.connect() as t:
        await t.publish(Topics("default").announce, ann.to_bytes(), retain=True)
        got = await announced_round(t, "default", 1.0)
        assert await announced_round(t, "other", 0.05) is None
    data = listing(led, "default", 10, got)
    assert [(r["round_id"], r["announced"]) for r in data["running"]] == [("r3", True)]
    assert {r["round_id"] for r in data["recent"]} == {"r1", "r2"}
    assert data["announced"]["n_min"] == 10
    r = CliRunner().invoke(app, ["rounds", "--json"], env={"SHUFFLEKIT_STATE": str(tmp_path)})
    assert r.exit_code == 0 and [x["round_id"] for x in json.loads(r.stdout)["running"]] == ["r3"]


def test_round_ids_stay_whole_on_an_80_column_terminal(tmp_path: Path) -> None:
    """`budget refund` takes a round id from `budget status` or `budget history`: on an
    80-column terminal both cut the ids ("r1795776101-d07a7…") and the numbers beside them."""
    url = f"sqlite:///{tmp_path / 'l.db'}"
    led = Ledger(url)
    led.init_budget(Budget("default", 10.0, 1e-6, n_min=1000))
    ids = [f"r1795776101-d07a7{i:03d}" for i in range(2)]
    for rid in ids:
        led.reserve("default", rid, 10, 2.0)
        led.commit("default", rid, 2000)
    for command in ("status", "history"):
        out = run_cli_tty(["budget", command, "--ledger", url], tmp_path, columns=80).stdout
        assert all(rid in out for rid in ids), out
        assert "…" not in out, out  # folded where too narrow, never cut
