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

        self.owner_sandboxes = Gauge(
            "orchard_owner_sandboxes", "Sandboxes per owner", ["owner"], registry=self.registry
        )
        self.owner_cpu = Gauge(
            "orchard_owner_cpu_cores",
            "CPU cores per owner, summed over running sandboxes",
            ["owner"],
            registry=self.registry,
        )
        self.owner_memory = Gauge(
            "orchard_owner_memory_bytes",
            "Memory limits per owner, summed over running sandboxes",
            ["owner"],
            registry=self.registry,
        )
        self.refusals = Counter(
            "orchard_admission_refusals",
            "Creates refused by admission control, by owner and limit",
            ["owner", "limit"],
            registry=self.registry,
        )

    def set_owners(self, held: dict[str, tuple[int, float, int]]) -> None:
        """Per-owner gauges from (sandboxes, cpu, memory); owners now holding nothing go."""
        for gauge in (self.owner_sandboxes, self.owner_cpu, self.owner_memory):
            gauge.clear()
        for owner, (n, cpu, memory) in held.items():
            self.owner_sandboxes.labels(owner).set(n)
            self.owner_cpu.labels(owner).set(cpu)
            self.owner_memory.labels(owner).set(memory)

    def set_states(self, states: list[str]) -> None:
        tally = Tally(states)
        for state in STATES:
            self.sandboxes.labels(state).set(tally.get(state, 0))

    def render(self) -> bytes:
        return generate_latest(self.registry)
