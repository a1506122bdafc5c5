"""Whole deployments as deterministic simulations: virtual time, seeded faults, invariants."""
