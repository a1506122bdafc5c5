"""`shufflekit serve mix` starts without the ledger: a mix never opens it (only the coordinator
and the analyzer do), yet every mix process loaded it, SQLAlchemy and the accountant's engines
(scipy) at start (1.2 s of imports, in every mix of a deployment and of the service tests).

Checked as tests/test_cli_startup.py checks `--help`: by what is in `sys.modules`, in a fresh
interpreter, never by the clock.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from shufflekit.app.services.keys import KeyFiles, write_key_pair

#: What a mix never uses: the ledger, its database layer, the accountant's numerics.
UNUSED = ("shufflekit.accountant.ledger", "scipy", "sqlalchemy", "dp_accounting")

# Runs the console script's `main` with ARGV, up to the mix's serve loop: the broker's client
# is built but never connected; an in-memory broker stands in for it, and the mix serves on it
# until it has subscribed (it logs "serving"), then stops. Prints the modules loaded then.
PROBE = """
import json, sys
from shufflekit.app.services import runtime
from shufflekit.core.transport.memory import MemoryBroker

async def serve_in_memory(name, connect, body, stop):
    connect()
    stop.set()
    async with MemoryBroker().connect() as transport:
        await body(transport)
    sys.__stderr__.write("\\nMODULES " + json.dumps(sorted(sys.modules)) + "\\n")

runtime.with_reconnect = serve_in_memory
sys.argv = ["shufflekit", *json.loads(sys.argv[1])]
from shufflekit.app.cli import main
main()
"""


def test_serve_mix_loads_neither_the_ledger_nor_the_accountants_numerics(tmp_path: Path) -> None:
    write_key_pair(KeyFiles.of(tmp_path / "keys", "mix1"))
    config = tmp_path / "sk.toml"
    config.write_text(
        'broker = "mqtt://127.0.0.1:1"\ndeployment = "t"\nmixes = 2\n'
        "[mix]\nindex = 1\npeel_workers = 0\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(["serve", "mix", "--config", str(config)])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and "mix 1: serving deployment t" in out.stderr, out.stderr
    modules = json.loads(out.stderr.rsplit("MODULES ", 1)[1].splitlines()[0])
    assert "shufflekit.shuffler.mix" in modules and "shufflekit.app.hops" in modules
    assert sorted(m for m in modules if m.split(".")[0] in UNUSED or m in UNUSED) == []
