"""Match versions against simple comparator ranges such as ">=1.2.0 <2.0.0"."""

import operator
from collections.abc import Callable

from semverlite.version import Version, parse

_OPS: dict[str, Callable[[Version, Version], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
    "==": operator.eq,
}


def satisfies(version: str | Version, spec: str) -> bool:
    """True if `version` meets every space-separated comparator in `spec`."""
    v = parse(version) if isinstance(version, str) else version
    for clause in spec.split():
        for op in (">=", "<=", "==", ">", "<"):
            if clause.startswith(op):
                if not _OPS[op](v, parse(clause[len(op) :])):
                    return False
                break
        else:
            raise ValueError(f"bad comparator: {clause!r}")
    return True
