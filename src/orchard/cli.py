"""`orchard` command line: run the service, and create, use and clean up sandboxes.

Every command takes `--json` (machine-readable output only, on stdout). Errors print one
line, `error: <code>: <message>`, on stderr and exit non-zero; never a traceback.
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
import os
import shlex
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, NoReturn

import typer
from pydantic_core import to_jsonable_python
from rich.console import Console
from rich.table import Table

from orchard.claw.cli import claw_app
from orchard.env.errors import OrchardError
from orchard.gui.cli import gui_app
from orchard.swe.cli import swe_app
from orchard.train.cli import train_app

if TYPE_CHECKING:
    from orchard.env.models import Sandbox as SandboxInfo
    from orchard.env.sdk import Orchard, Sandbox

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def _examples(*lines: str) -> str:
    return "[bold]Examples[/bold]\n\n" + "\n\n".join(f"  {line}" for line in lines)


app = typer.Typer(
    name="orchard",
    help="Orchard: fast, secure sandboxes for LLM agents.",
    epilog=_examples(
        "orchard serve --uds /tmp/orchard.sock",
        "export ORCHARD_URL=unix:///tmp/orchard.sock",
        "ID=$(orchard sandbox create busybox:latest)",
        "orchard sandbox exec $ID -- uname -a",
        "orchard sandbox rm $ID",
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)
sandbox_app = typer.Typer(
    help="Create, use and remove sandboxes.",
    epilog=_examples(
        "orchard sandbox create debian:12 --label team=ml --timeout 600",
        "orchard sandbox ls --label team=ml",
        "orchard sandbox shell $ID",
    ),
    no_args_is_help=True,
)
app.add_typer(sandbox_app, name="sandbox")
app.add_typer(swe_app, name="swe")
app.add_typer(train_app, name="train")
app.add_typer(claw_app, name="claw")
app.add_typer(gui_app, name="gui")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON only.")]


class _Globals:
    url: str | None = None
    api_key: str | None = None


@app.callback()
def _global(
    url: Annotated[
        str | None,
        typer.Option(
            "--url",
            envvar="ORCHARD_URL",
            help="Service URL (http://host:port or unix:///path.sock). "
            "Unset: run the service in-process on local Docker.",
        ),
    ] = None,
    api_key: Annotated[
        str | None, typer.Option("--api-key", envvar="ORCHARD_API_KEY", help="API key.")
    ] = None,
) -> None:
    _Globals.url, _Globals.api_key = url, api_key


def _client() -> Orchard:
    from orchard.env.sdk import Orchard

    return Orchard(_Globals.url, _Globals.api_key)


def _print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(to_jsonable_python(value), indent=2) + "\n")


def _fail(code: str, message: str) -> NoReturn:
    err.print(f"error: {code}: {message}", markup=False)
    raise typer.Exit(1)


def _pairs(items: list[str] | None, what: str) -> dict[str, str]:
    """`K=V` options into a dict."""
    result: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            _fail("bad_request", f"{what} must look like KEY=VALUE, got {item!r}")
        result[key] = value
    return result


# ---------------------------------------------------------------- serve


@app.command(
    epilog=_examples(
        "orchard serve                          # http://127.0.0.1:8080, no auth",
        "orchard serve --uds /tmp/orchard.sock  # a Unix socket",
        "ORCHARD_API_KEYS=alice:s3cret orchard serve --host 0.0.0.0",
    )
)
def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8080,
    uds: Annotated[str | None, typer.Option(help="Listen on this Unix socket instead.")] = None,
    backend: Annotated[
        str | None,
        typer.Option(
            help="Where sandboxes run: docker, local (runc), kubernetes, or auto (docker if an "
            "engine answers, else local). Default: $ORCHARD_BACKEND, else auto.",
            show_default=False,
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
) -> None:
    """Run the Orchard service (REST API) until interrupted."""
    from orchard.env.api import serve as run_service
    from orchard.env.config import ConfigError, ServiceConfig

    try:
        config = ServiceConfig.from_env(backend=backend)
        run_service(config, host=host, port=port, uds=uds, log_level=log_level)
    except ConfigError as exc:
        _fail("bad_request", str(exc))


# ---------------------------------------------------------------- create / ls / inspect


@sandbox_app.command(
    epilog=_examples(
        "orchard sandbox create busybox:latest",
        "orchard sandbox create debian:12 -e PYTHONUNBUFFERED=1 -l task=42 --cpu 2 --memory 4g",
        "orchard sandbox create debian:12 --egress allow --allow 10.0.0.0/8 --allow pypi.org",
        "orchard sandbox create debian:12 --count 100 --label run=a  # progress bar",
        "orchard sandbox create nginx:1 --cmd ''  # keep the image's own entrypoint",
    )
)
def create(
    image: Annotated[str, typer.Argument(help="Any OCI image reference.")],
    count: Annotated[int, typer.Option("--count", "-n", min=1, help="How many.")] = 1,
    env: Annotated[list[str] | None, typer.Option("--env", "-e", help="K=V, repeatable.")] = None,
    label: Annotated[
        list[str] | None, typer.Option("--label", "-l", help="K=V, repeatable.")
    ] = None,
    cpu: Annotated[float | None, typer.Option(help="CPU cores.")] = None,
    memory: Annotated[str | None, typer.Option(help="Memory limit, e.g. 512m, 2g.")] = None,
    timeout: Annotated[float, typer.Option(help="Time to live in seconds.")] = 3600,
    idle_timeout: Annotated[
        float | None, typer.Option(help="Delete after this many idle seconds.")
    ] = None,
    egress: Annotated[
        Literal["none", "all", "allow"], typer.Option(help="Network egress policy.")
    ] = "none",
    allow: Annotated[
        list[str] | None, typer.Option(help="CIDR or host name (with --egress allow).")
    ] = None,
    cmd: Annotated[
        str | None, typer.Option(help="Command to run (shell words); '' = the image's own.")
    ] = None,
    workdir: Annotated[str | None, typer.Option(help="Working folder.")] = None,
    user: Annotated[str | None, typer.Option(help="uid[:gid] or name.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Create sandboxes; prints their ids (one per line)."""
    from orchard.env._sdk_core import CreateOptions

    opts: CreateOptions = {
        "env": _pairs(env, "--env"),
        "labels": _pairs(label, "--label"),
        "timeout_s": timeout,
        "network": {"egress": egress, "allow": list(allow or [])},
    }
    for key, value in (
        ("cpu", cpu),
        ("memory", memory),
        ("idle_timeout_s", idle_timeout),
        ("workdir", workdir),
        ("user", user),
    ):
        if value is not None:
            opts[key] = value  # type: ignore[literal-required]
    if cmd is not None:
        opts["cmd"] = shlex.split(cmd)
    with _client() as client:
        if count == 1:
            infos = [client.sandboxes.create(image, **opts).info]
            failures: list[str] = []
        else:
            infos, failures = _create_many(client, image, count, opts, show=not json_out)
    if json_out:
        _print_json({"sandboxes": infos, "errors": failures})
    else:
        for info in infos:
            out.print(info.id)
        for failure in failures:
            err.print(f"error: {failure}", markup=False)
    if failures:
        raise typer.Exit(1)


def _create_many(
    client: Orchard, image: str, count: int, opts: Any, *, show: bool
) -> tuple[list[SandboxInfo], list[str]]:
    """Batch-create in a few concurrent chunks so the progress bar moves as they land."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    chunk = max(1, min(50, math.ceil(count / 10)))
    sizes = [min(chunk, count - i) for i in range(0, count, chunk)]
    infos: list[SandboxInfo] = []
    failures: list[str] = []
    columns = ("{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with (
        Progress(*columns, console=err, disable=not show) as progress,
        ThreadPoolExecutor(max_workers=4) as pool,
    ):
        task = progress.add_task(f"creating {count} x {image}", total=count)
        futures = {pool.submit(client.sandboxes.create_batch, image, n, **opts): n for n in sizes}
        for future in as_completed(futures):
            try:
                batch = future.result()
            except OrchardError as exc:
                failures.extend([f"{exc.code}: {exc.message}"] * futures[future])
            else:
                infos.extend(sb.info for sb in batch)
                failures.extend(f"{e.code}: {e.message}" for e in batch.errors)
            progress.advance(task, futures[future])
    return infos, failures


def _age(ts: datetime) -> str:
    seconds = (ts - datetime.now(UTC)).total_seconds()
    sign, s = ("-" if seconds < 0 else ""), abs(int(seconds))
    if s >= 3600:
        return f"{sign}{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{sign}{s // 60}m{s % 60:02d}s"


@sandbox_app.command(
    "ls",
    epilog=_examples(
        "orchard sandbox ls",
        "orchard sandbox ls --label team=ml --json | jq -r '.[].id'",
        "orchard sandbox rm $(orchard sandbox ls -q --label run=a)",
    ),
)
def list_(
    label: Annotated[
        list[str] | None, typer.Option("--label", "-l", help="K=V filter, repeatable.")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only ids.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """List your sandboxes."""
    with _client() as client:
        infos = [sb.info for sb in client.sandboxes.list(labels=_pairs(label, "--label"))]
    if json_out:
        _print_json(infos)
        return
    if quiet:
        for info in infos:
            out.print(info.id)
        return
    table = Table(box=None, header_style="bold")
    for column in ("ID", "IMAGE", "STATUS", "EXPIRES IN", "EGRESS", "LABELS"):
        table.add_column(column)
    for info in infos:
        labels = ",".join(f"{k}={v}" for k, v in sorted(info.labels.items()))
        table.add_row(
            info.id,
            info.image,
            info.status,
            _age(info.expires_at),
            info.network.egress,
            labels,
        )
    out.print(table)


@sandbox_app.command(
    epilog=_examples("orchard sandbox inspect $ID", "orchard sandbox inspect $ID --json")
)
def inspect(
    sandbox_id: Annotated[str, typer.Argument(metavar="ID")],
    json_out: JsonOpt = False,
) -> None:
    """Show one sandbox and its background processes."""
    with _client() as client:
        sb = client.sandboxes.get(sandbox_id)
        processes = sb.process.list() if sb.info.status == "ready" else []
    if json_out:
        _print_json({**sb.info.model_dump(mode="json"), "processes": processes})
        return
    info = sb.info
    rows = {
        "id": info.id,
        "image": info.image,
        "status": info.status + (f" (exit code {info.exit_code})" if info.exit_code else ""),
        "created": info.created_at.isoformat(),
        "expires": f"{info.expires_at.isoformat()} (in {_age(info.expires_at)})",
        "network": " ".join([info.network.egress, *info.network.allow]),
        "resources": ", ".join(
            f"{k}={v}" for k, v in info.resources.model_dump().items() if v is not None
        )
        or "-",
        "labels": ", ".join(f"{k}={v}" for k, v in info.labels.items()) or "-",
    }
    if info.error:
        rows["error"] = info.error
    for key, value in rows.items():
        out.print(f"[bold]{key:>10}[/bold]  {value}")
    for p in processes:
        state = p.status if p.exit_code is None else f"exited {p.exit_code}"
        out.print(f"[bold]{'process':>10}[/bold]  {p.id}  {state}  {p.cmd}", markup=True)


# ---------------------------------------------------------------- exec / shell


def _command(words: list[str]) -> str | list[str]:
    """One word with spaces or shell syntax runs under /bin/sh -c; several run as argv."""
    if len(words) == 1 and (set(words[0]) & set(" \t\n|&;<>()$`\\\"'*?[#~=%")):
        return words[0]
    return words


@sandbox_app.command(
    "exec",
    epilog=_examples(
        "orchard sandbox exec $ID -- ls -la /",
        "orchard sandbox exec $ID -- 'cd /src && make test'   # one word: run by /bin/sh -c",
        "echo hi | orchard sandbox exec -i $ID -- cat",
        "orchard sandbox exec $ID --timeout 60 --json -- pytest -q",
    ),
)
def exec_(
    sandbox_id: Annotated[str, typer.Argument(metavar="ID")],
    cmd: Annotated[list[str], typer.Argument(metavar="CMD...", help="The command (after --).")],
    cwd: Annotated[str | None, typer.Option(help="Working folder.")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", "-e", help="K=V, repeatable.")] = None,
    user: Annotated[str | None, typer.Option(help="uid[:gid] or name.")] = None,
    timeout: Annotated[float | None, typer.Option(help="Kill it after this many seconds.")] = None,
    interactive: Annotated[
        bool, typer.Option("--interactive", "-i", help="Send local stdin to the command.")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Run a command, streaming its output; exits with the command's exit code."""
    from orchard.env._sdk_core import ExecOptions

    opts: ExecOptions = {"cwd": cwd, "env": _pairs(env, "--env"), "user": user}
    if timeout is not None:
        opts["timeout_s"] = timeout
    if interactive:
        opts["stdin"] = sys.stdin.buffer.read()
    command = _command(cmd)
    with _client() as client:
        sb = client.sandboxes.get(sandbox_id)
        if json_out:
            result = sb.exec(command, **opts)
            _print_json(result)
            raise typer.Exit(result.exit_code)
        code = 0
        opts["output_encoding"] = "base64"  # byte-exact, whatever the program prints
        for event in sb.exec_stream(command, **opts):
            if event.type in ("stdout", "stderr") and event.data:
                stream = sys.stdout if event.type == "stdout" else sys.stderr
                stream.buffer.write(base64.b64decode(event.data))
                stream.buffer.flush()
            elif event.type == "exit":
                code = event.exit_code if event.exit_code is not None else 1
                if event.timed_out:
                    err.print(f"error: timeout: killed after {timeout} s", markup=False)
    raise typer.Exit(code)


@sandbox_app.command(
    epilog=_examples(
        "orchard sandbox shell $ID",
        "orchard sandbox shell $ID /bin/bash",
        "exit the shell (exit, Ctrl-D) to come back",
    )
)
def shell(
    sandbox_id: Annotated[str, typer.Argument(metavar="ID")],
    program: Annotated[str, typer.Argument(metavar="[SHELL]", help="Shell to run.")] = "/bin/sh",
    json_out: JsonOpt = False,
) -> None:
    """Open an interactive shell (a PTY) in the sandbox."""
    with _client() as client:
        sb = client.sandboxes.get(sandbox_id)
        code = run_shell(sb, program)
    if json_out:
        _print_json({"exit_code": code})
    raise typer.Exit(code)


def run_shell(sb: Sandbox, program: str) -> int:
    """Attach this terminal to a PTY process in the sandbox; returns the shell's exit code.

    Raw mode makes every key (Ctrl-C included) go to the remote shell; the remote PTY
    echoes. Output comes from the follow stream in a thread; SIGWINCH becomes a resize.
    """
    import signal
    import termios
    import threading
    import tty

    fd = sys.stdin.fileno()
    is_tty = os.isatty(fd)
    cols, rows = _terminal_size(fd)
    term = os.environ.get("TERM", "xterm")
    proc = sb.process.start([program], pty=True, rows=rows, cols=cols, env={"TERM": term})
    exit_code: list[int] = []
    finished = threading.Event()
    resized = threading.Event()

    def pump() -> None:
        try:
            for event in sb.process.follow(proc.id, encoding="base64"):
                if event.type == "stdout" and event.data:
                    os.write(sys.stdout.fileno(), base64.b64decode(event.data))
                elif event.type == "exit":
                    exit_code.append(event.exit_code if event.exit_code is not None else 1)
        finally:
            finished.set()

    saved = termios.tcgetattr(fd) if is_tty else None
    old_handler = signal.signal(signal.SIGWINCH, lambda *_: resized.set())
    reader = threading.Thread(target=pump, name="orchard-shell-output", daemon=True)
    try:
        if is_tty:
            tty.setraw(fd, termios.TCSANOW)  # not TCSAFLUSH: keep what was typed ahead
        reader.start()
        _forward_input(sb, proc.id, fd, finished, resized)
        reader.join()
    finally:
        if saved is not None:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        signal.signal(signal.SIGWINCH, old_handler)
        with contextlib.suppress(OrchardError):
            sb.process.remove(proc.id)
    return exit_code[0] if exit_code else 1


def _terminal_size(fd: int) -> tuple[int, int]:
    """(cols, rows); a terminal that reports 0x0 (fresh PTYs do) gets the classic 80x24."""
    try:
        cols, rows = os.get_terminal_size(fd)
    except OSError:
        return 80, 24
    return (cols or 80), (rows or 24)


def _forward_input(
    sb: Sandbox, pid: str, fd: int, finished: threading.Event, resized: threading.Event
) -> None:
    import select

    from orchard.env.errors import Conflict

    while not finished.is_set():
        if resized.is_set():
            resized.clear()
            cols, rows = _terminal_size(fd)
            with contextlib.suppress(Conflict):
                sb.process.resize(pid, rows, cols)
        ready, _, _ = select.select([fd], [], [], 0.1)
        if not ready:
            continue
        data = os.read(fd, 4096)
        try:
            if data:
                sb.process.stdin(pid, data)
            else:  # local EOF: let the shell see it, then wait for it to end
                sb.process.close_stdin(pid)
                finished.wait()
        except Conflict:
            return  # the shell exited (or closed its stdin) while we typed


# ---------------------------------------------------------------- cp


def _location(spec: str) -> tuple[str | None, str]:
    """`ID:/abs/path` is in a sandbox; anything else is a local path."""
    head, sep, tail = spec.partition(":")
    if sep and head and "/" not in head and tail.startswith("/"):
        return head, tail
    return None, spec


def _remote_join(folder: str, name: str) -> str:
    return folder.rstrip("/") + "/" + name


@sandbox_app.command(
    epilog=_examples(
        "orchard sandbox cp ./src $ID:/work/src        # a folder, as a tar stream",
        "orchard sandbox cp $ID:/work/report.json .    # a file, into this folder",
        "orchard sandbox cp $ID:/var/log ./logs --json",
    )
)
def cp(
    src: Annotated[str, typer.Argument(help="Local path or ID:/path.")],
    dst: Annotated[str, typer.Argument(help="Local path or ID:/path.")],
    json_out: JsonOpt = False,
) -> None:
    """Copy files or folders between this machine and a sandbox (either way)."""
    (src_id, src_path), (dst_id, dst_path) = _location(src), _location(dst)
    if (src_id is None) == (dst_id is None):
        _fail("bad_request", "exactly one of SRC and DST must be ID:/path")
    with _client() as client:
        if dst_id is not None:
            sb = client.sandboxes.get(dst_id)
            result = _upload(sb, Path(src_path), dst_path)
        else:
            assert src_id is not None
            sb = client.sandboxes.get(src_id)
            result = _download(sb, src_path, Path(dst_path))
    if json_out:
        _print_json(result)
    else:
        out.print(f"copied {result['files']} file(s), {result['bytes']} bytes to {result['to']}")


def _upload(sb: Sandbox, src: Path, dst: str) -> dict[str, Any]:
    from orchard.env.errors import NotFound

    if not src.exists():
        _fail("not_found", f"no such local file or folder: {src}")
    try:
        into = sb.files.stat(dst).type == "dir"
    except NotFound:
        into = dst.endswith("/")
    target = _remote_join(dst, src.name) if into else dst
    if src.is_dir():
        tar = sb.files.upload_dir(src, target)
        return {"files": tar.files, "bytes": tar.bytes, "to": target}
    with src.open("rb") as f:
        stat = sb.files.write(target, f, mode=src.stat().st_mode & 0o7777)
    return {"files": 1, "bytes": stat.size, "to": stat.path}


def _download(sb: Sandbox, src: str, dst: Path) -> dict[str, Any]:
    remote = sb.files.stat(src)
    name = remote.name or Path(src).name
    target = dst / name if dst.is_dir() else dst
    if remote.type == "dir":
        tar = sb.files.download_dir(src, target)
        return {"files": tar.files, "bytes": tar.bytes, "to": str(target)}
    data = sb.files.read(src)
    target.write_bytes(data)
    target.chmod(remote.mode & 0o777)
    return {"files": 1, "bytes": len(data), "to": str(target)}


# ---------------------------------------------------------------- rm / gc


def _delete_all(client: Orchard, ids: list[str]) -> tuple[list[str], list[str]]:
    removed: list[str] = []
    failures: list[str] = []
    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = {pool.submit(client.sandboxes.delete, i): i for i in ids}
        for future in as_completed(futures):
            try:
                future.result()
                removed.append(futures[future])
            except OrchardError as exc:
                failures.append(f"{futures[future]}: {exc.code}: {exc.message}")
    return sorted(removed), failures


def _report_removed(removed: list[str], failures: list[str], json_out: bool) -> None:
    if json_out:
        _print_json({"removed": removed, "errors": failures})
    else:
        for sandbox_id in removed:
            out.print(sandbox_id)
        for failure in failures:
            err.print(f"error: {failure}", markup=False)
    if failures:
        raise typer.Exit(1)


@sandbox_app.command(
    epilog=_examples(
        "orchard sandbox rm $ID",
        "orchard sandbox rm $ID1 $ID2",
        "orchard sandbox rm --all --label run=a",
    )
)
def rm(
    sandbox_ids: Annotated[list[str] | None, typer.Argument(metavar="ID...")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Every sandbox (matching --label).")] = False,
    label: Annotated[
        list[str] | None, typer.Option("--label", "-l", help="K=V filter for --all.")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Delete sandboxes; prints the ids removed."""
    ids = list(sandbox_ids or [])
    if not ids and not all_:
        _fail("bad_request", "name sandboxes to remove, or pass --all")
    with _client() as client:
        if all_:
            ids += [sb.id for sb in client.sandboxes.list(labels=_pairs(label, "--label"))]
        removed, failures = _delete_all(client, sorted(set(ids)))
    _report_removed(removed, failures, json_out)


@sandbox_app.command(
    epilog=_examples("orchard sandbox gc", "orchard sandbox gc --label run=a --json")
)
def gc(
    label: Annotated[
        list[str] | None, typer.Option("--label", "-l", help="K=V filter, repeatable.")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Delete sandboxes that have exited, failed or outlived their timeout."""
    now = datetime.now(UTC)
    with _client() as client:
        stale = [
            sb.id
            for sb in client.sandboxes.list(labels=_pairs(label, "--label"))
            if sb.info.status in ("exited", "failed") or sb.info.expires_at <= now
        ]
        removed, failures = _delete_all(client, stale)
    _report_removed(removed, failures, json_out)


# ---------------------------------------------------------------- entry point


def _run(invoke: Callable[[], Any]) -> int:
    try:
        invoke()
    except OrchardError as exc:
        err.print(f"error: {exc.code}: {exc.message}", markup=False)
        return 1
    except FileNotFoundError as exc:
        err.print(f"error: not_found: {exc}", markup=False)
        return 1
    except KeyboardInterrupt:
        return 130
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except Exception as exc:  # a bug or an unexpected failure: still one line, no traceback
        err.print(f"error: internal: {type(exc).__name__}: {exc}", markup=False)
        return 1
    return 0


def main(argv: list[str] | None = None) -> None:
    sys.exit(_run(lambda: app(args=argv, prog_name="orchard")))


if __name__ == "__main__":
    main()
