"""The Kubernetes backend: one pod per sandbox, the agent copied in by an init container.

`backend.py` (`KubernetesBackend`: pods, NetworkPolicies, the API's errors), `objects.py`
(the objects it creates, pure builders; `KubernetesOptions`), `node.py` (the node helper's
client), `state.py` (pause, diffs through the node helper), `registry.py` (the in-cluster
registry's client). Chosen by name (`kubernetes`); needs the `kubernetes` extra.
"""
