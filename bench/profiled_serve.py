"""`orchard serve` under cProfile: `profiled_serve.py OUT serve ARGS...` dumps stats to OUT.

Used by the benchmarks' service process when ORCHARD_BENCH_PROFILE is set. The stats are
written in a `finally`, so the SIGTERM the benchmark stops the service with (uvicorn turns
it into a normal return) still leaves them; cProfile sees the event loop's thread, which is
where the service's own per-request work runs.
"""

from __future__ import annotations

import cProfile
import sys

from orchard.cli import main


def run(out: str, argv: list[str]) -> None:
    prof = cProfile.Profile()
    prof.enable()
    try:
        main(argv)
    finally:
        prof.disable()
        prof.dump_stats(out)
        print(f"profile: {out}", file=sys.stderr)


if __name__ == "__main__":
    run(sys.argv[1], sys.argv[2:])
