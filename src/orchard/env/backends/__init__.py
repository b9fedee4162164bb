"""Backends: where sandboxes actually run (Docker today; Kubernetes and runc later)."""
