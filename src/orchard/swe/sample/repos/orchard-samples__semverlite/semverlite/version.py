"""The Version type."""

import re
from dataclasses import dataclass, field

_SEMVER = re.compile(
    r"^(?P<major>0|[1-9]\d*)\.(?P<minor>0|[1-9]\d*)\.(?P<patch>0|[1-9]\d*)"
    r"(?:-(?P<pre>[0-9A-Za-z.-]+))?(?:\+(?P<build>[0-9A-Za-z.-]+))?$"
)


@dataclass(frozen=True)
class Version:
    major: int
    minor: int
    patch: int
    prerelease: tuple[str, ...] = ()
    build: str = field(default="", compare=False)

    def _key(self) -> tuple[int, int, int, tuple[str, ...]]:
        return (self.major, self.minor, self.patch, self.prerelease)

    def __lt__(self, other: "Version") -> bool:
        return self._key() < other._key()

    def __le__(self, other: "Version") -> bool:
        return self == other or self < other

    def __gt__(self, other: "Version") -> bool:
        return other < self

    def __ge__(self, other: "Version") -> bool:
        return self == other or other < self

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.prerelease:
            text += "-" + ".".join(self.prerelease)
        if self.build:
            text += "+" + self.build
        return text


def parse(text: str) -> Version:
    """Parse `MAJOR.MINOR.PATCH[-PRERELEASE][+BUILD]`."""
    m = _SEMVER.match(text.strip())
    if m is None:
        raise ValueError(f"not a semantic version: {text!r}")
    pre = tuple(m["pre"].split(".")) if m["pre"] else ()
    return Version(int(m["major"]), int(m["minor"]), int(m["patch"]), pre, m["build"] or "")
