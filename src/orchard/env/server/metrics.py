"""Prometheus metrics of one service (own registry, so several apps can share a process)."""

from __future__ import annotations

from collections import Counter as Tally

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

STATES = ("pending", "ready", "exited", "failed")


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.sandboxes = Gauge(
            "orchard_sandboxes",
            "Sandboxes known to the service, by state",
            ["state"],
            registry=self.registry,
        )
        self.creates = Counter(
            "orchard_sandbox_creates",
            "Sandbox creations, by outcome (ok or error code)",
            ["outcome"],
            registry=self.registry,
        )
        self.exec_latency = Histogram(
            "orchard_exec_seconds",
            "Blocking exec latency through the service (seconds)",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
            registry=self.registry,
        )
        self.errors = Counter(
            "orchard_errors", "Error responses, by error code", ["code"], registry=self.registry
        )
        self.reconciles = Counter(
            "orchard_reconcile_removed",
            "Sandboxes removed by reconcile, by reason",
            ["reason"],
            registry=self.registry,
        )

    def set_states(self, states: list[str]) -> None:
        tally = Tally(states)
        for state in STATES:
            self.sandboxes.labels(state).set(tally.get(state, 0))

    def render(self) -> bytes:
        return generate_latest(self.registry)
