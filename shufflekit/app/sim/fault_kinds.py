"""The kinds of fault a simulated deployment can inject, apart from the simulation itself.

`shufflekit chaos --help` lists them; importing this costs nothing, where `sim.world` loads the
services, the ledger and the crypto.
"""

FAULT_KINDS = (
    "drop",
    "duplicate",
    "delay",
    "reorder",
    "disconnect",
    "broker_restart",
    "crash",
    "restart",
    "ledger_busy",
    "hostile_clients",
    "ledger_outage",
    "ledger_lost_reply",
    "small_budget",
    "reservation_ttl",
    "twin_coordinator",
    "coordinator_pause",
)
