"""Orchard Env: the sandbox service, its backends, the agent client and the SDK."""
