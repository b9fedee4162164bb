"""The runs viewer (`orchard dashboard --runs DIR`): the run folders under DIR (SWE, GUI,
Claw, pass@k) as local web pages: each run's attempts with verdicts, rewards and sandbox
ids, a transcript per attempt, GUI screenshots in order, reward and pass@k plots, and the
command that opens the run in Inspect's viewer.

A layer above the families (it reads their run folders) beside `cli/` and
`integrations/`; read-only, standard library HTTP, nothing fetched at run time.
"""

from __future__ import annotations

from orchard.dashboard.runs import Attempt, RunFolder, find_runs, load_run
from orchard.dashboard.server import RunsViewer, ViewerServer, make_server

__all__ = [
    "Attempt",
    "RunFolder",
    "RunsViewer",
    "ViewerServer",
    "find_runs",
    "load_run",
    "make_server",
]
