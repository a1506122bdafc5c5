"""The application layer: the CLI, the services, the coordinator, the demo and the experiments.

It is the one place that composes roles over a transport, a ledger and a clock.
"""
