"""The `orchard-verifiers` taskset for verifiers (`vf-eval orchard-verifiers ...`).

verifiers loads a taskset, its default harness and its env by the module its id names, so
this top-level package only re-exports them from `orchard.integrations.verifiers`.
"""

from orchard.integrations.verifiers import (
    OrchardChatHarness,
    OrchardEnv,
    OrchardTaskset,
)

__all__ = ["OrchardChatHarness", "OrchardEnv", "OrchardTaskset"]
