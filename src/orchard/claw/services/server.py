"""Start the Orchard-Claw mock services (stdlib only; runs under the sandbox's python3).

    python3 server.py --port 9000 --token-file /run/orchard/claw-token [--timeout-delay 3]

The services are a package (this folder) so they share code by relative imports; this
script puts the folder's parent on sys.path and runs the package's `app` module.
"""

import runpy
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here.parent))
runpy.run_module(f"{here.name}.app", run_name="__main__", alter_sys=True)
