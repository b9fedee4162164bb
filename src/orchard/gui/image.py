"""The browser sandbox image: Debian minbase + Debian's own Chromium and fonts, built offline.

Nothing of ours goes into the image (the Docker backend mounts the agent); the harness drives
Chromium from outside over CDP, so no Playwright or browser download is needed inside.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from orchard.env.images import ImageBuildError, debian_python_image

# python3 runs the offline sites' server; the two font packages cover Latin text and the
# metric-compatible Arial/Times/Courier faces pages ask for, so screenshots are readable.
BROWSER_PACKAGES: tuple[str, ...] = ("python3", "chromium", "fonts-dejavu-core", "fonts-liberation")
CHROMIUM_BIN = "/usr/bin/chromium"


def browser_image() -> str:
    """Return the tag of the browser image (content-addressed: built once, ~1 min, then reused)."""
    return debian_python_image(BROWSER_PACKAGES)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m orchard.gui.image`: build (or find) the image and print its tag."""
    del argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    try:
        print(browser_image())
    except (ImageBuildError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
