"""The backend contract: one suite of scenarios every backend runs (Inspect's `self_check`
is the model). A backend brings a `ContractHost` (its facts: how to make it, where its
agent listens, how to kill a sandbox behind its back, what a deleted one may not leave);
the scenarios are the same for docker, local and Kubernetes, and for a backend of your own
(docs/backends.md, "Adding a backend"). Only tests import this package.
"""

from __future__ import annotations

import traceback

from orchard.env.backend_contract.host import (
    CAPABILITIES,
    ContractFailure,
    ContractHost,
    EgressProbe,
    Facts,
    base_spec,
    expect,
    owned,
    raises,
)
from orchard.env.backend_contract.scenarios import SCENARIOS, Scenario

__all__ = [
    "CAPABILITIES",
    "SCENARIOS",
    "ContractFailure",
    "ContractHost",
    "EgressProbe",
    "Facts",
    "Scenario",
    "base_spec",
    "expect",
    "owned",
    "raises",
    "self_check",
]


async def self_check(host: ContractHost, only: list[str] | None = None) -> dict[str, str]:
    """Run the scenarios (or the ones named in `only`) on `host`, one after the other.

    :return: scenario name -> "passed", "skipped: <why>" or "failed: <what and where>"
    """
    results: dict[str, str] = {}
    for scenario in SCENARIOS:
        if only is not None and scenario.name not in only:
            continue
        if reason := scenario.skip_reason(host):
            results[scenario.name] = f"skipped: {reason}"
            continue
        try:
            await scenario.run(host)
        except Exception as e:  # a broken backend may raise anything: report it, go on
            frames = traceback.extract_tb(e.__traceback__)
            ours = [f for f in frames if "backend_contract" in f.filename] or frames
            where = ours[-1]
            results[scenario.name] = f"failed: {e!r} at {where.filename}:{where.lineno}"
        else:
            results[scenario.name] = "passed"
    return results
