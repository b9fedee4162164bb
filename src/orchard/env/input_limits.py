"""Bounds on what one create may carry (labels, env, sizes), kept in one place.

Labels are stored with the sandbox and sent back on every list, so unbounded ones slowed
every tenant (another tenant's list grew fifty-fold: issue 17, hole 7; docs/benchmarks.md);
env is stored in the engine's container config. The
defaults sit far above what the families and the 1,000-sandbox stress runs use. The
per-key quotas (`max_label_bytes`, `max_env_bytes`) are meant to start from these values:
read them here rather than copying numbers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

M = TypeVar("M", bound=Mapping[str, str])

KIB = 1 << 10
# Beyond any machine, and within the engine's int64.
MAX_SIZE_BYTES = 1 << 50
MIN_CPU = 0.01  # the kernel's CFS quota floor (1 ms per 100 ms period)
MIN_DISK_BYTES = 4 << 20
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


@dataclass(frozen=True)
class InputLimits:
    """Count and size bounds on a sandbox's labels and env (bytes are UTF-8)."""

    max_labels: int = 64
    max_label_key_bytes: int = 63
    max_label_value_bytes: int = 256
    max_label_bytes: int = 32 * KIB  # keys and values together (binds once quotas lower it)
    max_env: int = 256
    max_env_key_bytes: int = 1 * KIB
    max_env_value_bytes: int = 32 * KIB
    max_env_bytes: int = 256 * KIB  # keys and values together


DEFAULT_LIMITS = InputLimits()


def _check(
    what: str, items: Mapping[str, str], count: int, key: int, value: int, total: int
) -> None:
    if len(items) > count:
        raise ValueError(f"at most {count} {what} entries, got {len(items)}")
    size = 0
    for k, v in items.items():
        kb, vb = len(k.encode()), len(v.encode())
        if kb > key:
            raise ValueError(f"{what} key {k[:40]!r}... is {kb} bytes; at most {key}")
        if vb > value:
            raise ValueError(f"{what} value of {k[:40]!r} is {vb} bytes; at most {value}")
        size += kb + vb
    if size > total:
        raise ValueError(f"{what} entries take {size} bytes in all; at most {total}")


def check_labels(labels: M, limits: InputLimits = DEFAULT_LIMITS) -> M:
    """`labels`, or ValueError (a 422 from a model validator) if too many or too big."""
    lim = limits
    _check(
        "label",
        labels,
        lim.max_labels,
        lim.max_label_key_bytes,
        lim.max_label_value_bytes,
        lim.max_label_bytes,
    )
    return labels


def check_env(env: M, limits: InputLimits = DEFAULT_LIMITS) -> M:
    """`env`, or ValueError if it has too many entries or too many bytes."""
    lim = limits
    _check(
        "env", env, lim.max_env, lim.max_env_key_bytes, lim.max_env_value_bytes, lim.max_env_bytes
    )
    return env


def parse_size(value: str | int | None, what: str, minimum: int) -> int | None:
    """Bytes from an int or a string like '512m', '2g', '1.5GiB' (binary units).

    `memory` (sizing.parse_memory, 4 MiB least) and `disk`; raises ValueError."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"invalid {what} size {value!r}")
    if isinstance(value, int):
        n = value
    else:
        m = _SIZE_RE.match(value)
        if not m:
            hint = "use bytes, or e.g. '512m', '2g'"
            raise ValueError(f"invalid {what} size {value[:40]!r} ({hint})")
        size = float(m.group(1)) * _UNITS[m.group(2).lower()]  # may be inf: "9" * 400
        n = int(size) if size <= MAX_SIZE_BYTES else MAX_SIZE_BYTES + 1
    if n < minimum:
        raise ValueError(f"{what} must be at least {minimum >> 20} MiB, got {str(value)[:40]!r}")
    if n > MAX_SIZE_BYTES:
        raise ValueError(f"{what} must be at most 1 PiB, got {str(value)[:40]!r}")
    return n
