"""`orchard swe synth`: SWE tasks synthesized offline from real PyPI projects.

The pipeline, one module a step: `source` fetches and unpacks the sdist, `image` builds the
project's image from the shared Debian Python base (no pulls), `bugs` finds functions and
classes and applies SWE-smith's procedural modifiers to one at a time, `validate` runs the
test suite (baseline, then each candidate in a copy of the prepared sandbox), `rows` turns a
kept bug into a task row the harness grades (its problem statement from `statement`: a
model or a template), and `pipeline` ties them together, resumable.
"""
