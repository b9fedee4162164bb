"""The package version, in a module of its own so any layer can read it without importing
`orchard` (whose `__init__` reaches the SDK)."""

__version__ = "0.1.0"
