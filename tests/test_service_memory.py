"""A long-running service holds nothing in memory for a round that is over.

Mix 0 kept the ingest state (`MixNode.ingests`: the round's peeled reports, clients, digests,
receipts and its peeling job with the private key) of every round another hop or the
coordinator aborted while it was still collecting: a pilot whose analyzer was down for a day
left mix 0 one such entry per round (one a minute), for as long as mix 0 ran.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from shufflekit.accountant.ledger import Budget, Ledger
from shufflekit.app.coordinator import Coordinator
from shufflekit.app.hops import HopRunner
from shufflekit.app.rounds import RoundParams
from shufflekit.core.crypto import KeyPair
from shufflekit.core.spool import Spool
from shufflekit.core.transport import MemoryBroker
from shufflekit.shuffler.mix import MixNode


async def test_mix0_forgets_the_rounds_aborted_elsewhere_while_it_collected(
    tmp_path: Path,
) -> None:
    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    led.init_budget(Budget("test", 10.0, 1e-6, n_min=10, cost_model="ldp"))
    broker = MemoryBroker()
    key = KeyPair.generate()
    async with broker.connect() as m0, broker.connect() as coord_conn:
        stop = asyncio.Event()
        mix = MixNode(m0, "test", 0, key, spool=Spool(tmp_path / "spool-mix0.db"))
        serving = asyncio.create_task(HopRunner(mix, m0, "test").serve(stop))
        coord = Coordinator(
            coord_conn,
            "test",
            led,
            [key.public_b64()],
            KeyPair.generate().public_b64(),  # the analyzer is down: no round gets ready
            ready_timeout=0.5,
        )
        for _ in range(3):
            rep = await coord.run_round(RoundParams(k=4, eps0=1.0, n_min=10))
            assert rep.abort is not None and "not ready" in rep.abort.reason
        await asyncio.sleep(0.2)  # mix 0 has seen the last abort
        assert [r.status for r in led.status("test").rounds] == ["refunded"] * 3
        assert mix.ingests == {}
        assert mix.outcomes == {} and mix.early == {}
        stop.set()
        await asyncio.wait_for(serving, 5)
    led.close()
