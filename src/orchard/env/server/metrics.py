"""Prometheus metrics of one service (own registry, so several apps can share a process).

An operator's key (`ServiceConfig.operators`) sees them all; any other key sees only its
own owner's figures (`render_owner`): its sandboxes by state, what it holds, its refusals.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

STATES = ("pending", "ready", "paused", "exited", "failed")
OWNER_GAUGES = (
    ("orchard_owner_sandboxes", "Sandboxes per owner"),
    ("orchard_owner_cpu_cores", "CPU cores per owner, summed over running sandboxes"),
    ("orchard_owner_memory_bytes", "Memory limits per owner, summed over running sandboxes"),
)
REFUSALS = (
    "orchard_admission_refusals",
    "Creates refused by admission control, by owner and limit",
)


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

        self.owner_sandboxes, self.owner_cpu, self.owner_memory = (
            Gauge(name, doc, ["owner"], registry=self.registry) for name, doc in OWNER_GAUGES
        )
        self.refusals = Counter(*REFUSALS, ["owner", "limit"], registry=self.registry)

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
        """Every figure of the service, every owner's included (an operator's view)."""
        return generate_latest(self.registry)

    def render_owner(
        self, owner: str, states: Iterable[str], held: tuple[int, float, int]
    ) -> bytes:
        """One owner's own figures (a tenant's view): its sandboxes by state, the
        sandboxes, cpu and memory it holds (`held`), and its admission refusals."""
        tally = Tally(states)
        by_state = GaugeMetricFamily(
            "orchard_sandboxes", "Sandboxes of this key's owner, by state", labels=["state"]
        )
        for state in STATES:
            by_state.add_metric([state], tally.get(state, 0))
        families: list[Metric] = [by_state]
        for (name, doc), value in zip(OWNER_GAUGES, held, strict=True):
            family = GaugeMetricFamily(name, doc, labels=["owner"])
            family.add_metric([owner], value)
            families.append(family)
        refusals = CounterMetricFamily(*REFUSALS, labels=["owner", "limit"])
        for metric in self.refusals.collect():
            for sample in metric.samples:
                if sample.name.endswith("_total") and sample.labels.get("owner") == owner:
                    refusals.add_metric([owner, sample.labels["limit"]], sample.value)
        families.append(refusals)
        registry = CollectorRegistry()
        registry.register(_Fixed(families))
        return generate_latest(registry)


class _Fixed:
    """A collector of metric families computed beforehand (one tenant's view)."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self.families
