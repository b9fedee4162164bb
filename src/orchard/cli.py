"""`orchard` command line (being built: see issue 3)."""

from __future__ import annotations


def main() -> None:
    print("orchard: the CLI is under construction")
