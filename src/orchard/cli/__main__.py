"""`python -m orchard.cli ...` (what `accelerate launch -m orchard.cli train sft` runs)."""

from orchard.cli import main

main()
