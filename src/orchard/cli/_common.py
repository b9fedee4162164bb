"""What every command group shares: consoles, options, the one `fail`, tables, the client.

Errors print one line, `error: <code>: <message>`, on stderr and exit 1 (`fail`); library
code raises ordinary exceptions and the commands turn the expected ones into that line
(`bad_request`). The service the root options name (`--url`, `--api-key`) travels in the
typer context as a `Connection`, so `connect(ctx)` works in any command of any group.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from pydantic_core import to_jsonable_python
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from orchard.env.sdk import Orchard

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON only.")]
LabelOpt = Annotated[
    list[str] | None, typer.Option("--label", "-l", help="K=V on every sandbox (repeatable).")
]
ModelNameOpt = Annotated[
    str,
    typer.Option(
        "--model-name", envvar="ORCHARD_MODEL_NAME", help="Model name sent to the endpoint."
    ),
]


def examples(*lines: str) -> str:
    """A command's epilog: its example invocations, one per paragraph."""
    return "[bold]Examples[/bold]\n\n" + "\n\n".join(f"  {line}" for line in lines)


def fail(code: str, message: str) -> NoReturn:
    """Print `error: <code>: <message>` on one line of stderr and exit 1."""
    err.print(f"error: {code}: {message}", markup=False)
    raise typer.Exit(1)


@contextlib.contextmanager
def bad_request(*errors: type[Exception]) -> Iterator[None]:
    """Turn the given exceptions (default ValueError) into `fail("bad_request", ...)`."""
    caught = errors or (ValueError,)
    try:
        yield
    except caught as e:
        fail("bad_request", str(e))


def pairs(items: list[str] | None, what: str) -> dict[str, str]:
    """`K=V` options into a dict."""
    result: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail("bad_request", f"{what} must look like KEY=VALUE, got {item!r}")
        result[key] = value
    return result


def labels(items: list[str] | None) -> dict[str, str]:
    """`--label K=V` options into a dict."""
    return pairs(items, "--label")


def print_json(value: Any) -> None:
    """`value` as indented JSON on stdout (pydantic models and dataclasses included)."""
    sys.stdout.write(json.dumps(to_jsonable_python(value), indent=2) + "\n")


def print_table(table: Table) -> None:
    Console(highlight=False).print(table)


@dataclass
class Connection:
    """The service the root options name; None means an embedded one on local Docker."""

    url: str | None = None
    api_key: str | None = None

    def client(self) -> Orchard:
        from orchard.env.sdk import Orchard

        return Orchard(self.url, self.api_key)


def connect(ctx: typer.Context) -> Orchard:
    """A client of the service named by the root options (`orchard --url ... <command>`)."""
    return (ctx.find_object(Connection) or Connection()).client()
