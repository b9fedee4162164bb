"""`orchard sandbox ...`: create, list, inspect, use (exec, shell, cp) and remove sandboxes."""

from __future__ import annotations

import base64
import math
import shlex
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
from rich.table import Table

from orchard.cli._common import JsonOpt, connect, err, examples, fail, out, pairs, print_json
from orchard.cli._pty import run_shell
from orchard.env.errors import OrchardError

if TYPE_CHECKING:
    from orchard.env.models import Sandbox as SandboxInfo
    from orchard.env.sdk import Orchard, Sandbox

sandbox_app = typer.Typer(
    help="Create, use and remove sandboxes.",
    epilog=examples(
        "orchard sandbox create debian:12 --label team=ml --timeout 600",
        "orchard sandbox ls --label team=ml",
        "orchard sandbox shell $ID",
    ),
    no_args_is_help=True,
)


# ---------------------------------------------------------------- create / ls / inspect


@sandbox_app.command(
    epilog=examples(
        "orchard sandbox create busybox:latest",
        "orchard sandbox create debian:12 -e PYTHONUNBUFFERED=1 -l task=42 --cpu 2 --memory 4g",
        "orchard sandbox create debian:12 --egress allow --allow 10.0.0.0/8 --allow example.org",
        "orchard sandbox create debian:12 --count 100 --label run=a  # progress bar",
        "orchard sandbox create nginx:1 --cmd ''  # keep the image's own entrypoint",
        "orchard sandbox create debian:12 -v /data=outputs -v /cache=pip:ro",
    )
)
def create(
    ctx: typer.Context,
    image: Annotated[str, typer.Argument(help="Any OCI image reference.")] = "",
    snapshot: Annotated[
        str | None, typer.Option(help="Start from this snapshot (its image and settings).")
    ] = None,
    pool: Annotated[
        str | None, typer.Option(help="Claim a ready sandbox of this warm pool.")
    ] = None,
    count: Annotated[int, typer.Option("--count", "-n", min=1, help="How many.")] = 1,
    env: Annotated[list[str] | None, typer.Option("--env", "-e", help="K=V, repeatable.")] = None,
    label: Annotated[
        list[str] | None, typer.Option("--label", "-l", help="K=V, repeatable.")
    ] = None,
    cpu: Annotated[float | None, typer.Option(help="CPU cores.")] = None,
    memory: Annotated[str | None, typer.Option(help="Memory limit, e.g. 512m, 2g.")] = None,
    disk: Annotated[
        str | None, typer.Option(help="Disk limit for what the sandbox writes, e.g. 10g.")
    ] = None,
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
    volume: Annotated[
        list[str] | None,
        typer.Option("--volume", "-v", help="TARGET=NAME or TARGET=NAME:ro, repeatable."),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Create sandboxes; prints their ids (one per line)."""
    from orchard.env.sdk import CreateOptions

    opts: CreateOptions = {
        "env": pairs(env, "--env"),
        "labels": pairs(label, "--label"),
        "timeout_s": timeout,
        "network": {"egress": egress, "allow": list(allow or [])},
    }
    for key, value in (
        ("cpu", cpu),
        ("memory", memory),
        ("disk", disk),
        ("idle_timeout_s", idle_timeout),
        ("workdir", workdir),
        ("user", user),
    ):
        if value is not None:
            opts[key] = value  # type: ignore[literal-required]
    if cmd is not None:
        opts["cmd"] = shlex.split(cmd)
    if volume:
        opts["volumes"] = pairs(volume, "--volume")
    if snapshot:
        opts["snapshot"] = snapshot
        if egress == "none" and not allow:
            del opts["network"]  # the snapshot's own, unless one is given
        if not label:
            del opts["labels"]
    if pool:
        opts["pool"] = pool
        if egress == "none" and not allow:
            del opts["network"]  # the pool's own, unless one is given
    with connect(ctx) as client:
        if count == 1:
            infos = [client.sandboxes.create(image, **opts).info]
            failures: list[str] = []
        else:
            infos, failures = _create_many(client, image, count, opts, show=not json_out)
    if json_out:
        print_json({"sandboxes": infos, "errors": failures})
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
    epilog=examples(
        "orchard sandbox ls",
        "orchard sandbox ls --label team=ml --json | jq -r '.[].id'",
        "orchard sandbox rm $(orchard sandbox ls -q --label run=a)",
    ),
)
def list_(
    ctx: typer.Context,
    label: Annotated[
        list[str] | None, typer.Option("--label", "-l", help="K=V filter, repeatable.")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only ids.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """List your sandboxes."""
    with connect(ctx) as client:
        infos = [sb.info for sb in client.sandboxes.list(labels=pairs(label, "--label"))]
    if json_out:
        print_json(infos)
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
    epilog=examples("orchard sandbox inspect $ID", "orchard sandbox inspect $ID --json")
)
def inspect(
    ctx: typer.Context,
    sandbox_id: Annotated[str, typer.Argument(metavar="ID")],
    json_out: JsonOpt = False,
) -> None:
    """Show one sandbox and its background processes."""
    with connect(ctx) as client:
        sb = client.sandboxes.get(sandbox_id)
        processes = sb.process.list() if sb.info.status == "ready" else []
    if json_out:
        print_json({**sb.info.model_dump(mode="json"), "processes": processes})
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
    epilog=examples(
        "orchard sandbox exec $ID -- ls -la /",
        "orchard sandbox exec $ID -- 'cd /src && make test'   # one word: run by /bin/sh -c",
        "echo hi | orchard sandbox exec -i $ID -- cat",
        "orchard sandbox exec $ID --timeout 60 --json -- pytest -q",
    ),
)
def exec_(
    ctx: typer.Context,
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
    from orchard.env.sdk import ExecOptions

    opts: ExecOptions = {"cwd": cwd, "env": pairs(env, "--env"), "user": user}
    if timeout is not None:
        opts["timeout_s"] = timeout
    if interactive:
        opts["stdin"] = sys.stdin.buffer.read()
    command = _command(cmd)
    with connect(ctx) as client:
        sb = client.sandboxes.get(sandbox_id)
        if json_out:
            result = sb.exec(command, **opts)
            print_json(result)
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
    epilog=examples(
        "orchard sandbox shell $ID",
        "orchard sandbox shell $ID /bin/bash",
        "exit the shell (exit, Ctrl-D) to come back",
    )
)
def shell(
    ctx: typer.Context,
    sandbox_id: Annotated[str, typer.Argument(metavar="ID")],
    program: Annotated[str, typer.Argument(metavar="[SHELL]", help="Shell to run.")] = "/bin/sh",
    json_out: JsonOpt = False,
) -> None:
    """Open an interactive shell (a PTY) in the sandbox."""
    with connect(ctx) as client:
        sb = client.sandboxes.get(sandbox_id)
        code = run_shell(sb, program)
    if json_out:
        print_json({"exit_code": code})
    raise typer.Exit(code)


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
    epilog=examples(
        "orchard sandbox cp ./src $ID:/work/src        # a folder, as a tar stream",
        "orchard sandbox cp $ID:/work/report.json .    # a file, into this folder",
        "orchard sandbox cp $ID:/var/log ./logs --json",
    )
)
def cp(
    ctx: typer.Context,
    src: Annotated[str, typer.Argument(help="Local path or ID:/path.")],
    dst: Annotated[str, typer.Argument(help="Local path or ID:/path.")],
    json_out: JsonOpt = False,
) -> None:
    """Copy files or folders between this machine and a sandbox (either way)."""
    (src_id, src_path), (dst_id, dst_path) = _location(src), _location(dst)
    if (src_id is None) == (dst_id is None):
        fail("bad_request", "exactly one of SRC and DST must be ID:/path")
    with connect(ctx) as client:
        if dst_id is not None:
            sb = client.sandboxes.get(dst_id)
            result = _upload(sb, Path(src_path), dst_path)
        else:
            assert src_id is not None
            sb = client.sandboxes.get(src_id)
            result = _download(sb, src_path, Path(dst_path))
    if json_out:
        print_json(result)
    else:
        out.print(f"copied {result['files']} file(s), {result['bytes']} bytes to {result['to']}")


def _upload(sb: Sandbox, src: Path, dst: str) -> dict[str, Any]:
    from orchard.env.errors import NotFound

    if not src.exists():
        fail("not_found", f"no such local file or folder: {src}")
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
        print_json({"removed": removed, "errors": failures})
    else:
        for sandbox_id in removed:
            out.print(sandbox_id)
        for failure in failures:
            err.print(f"error: {failure}", markup=False)
    if failures:
        raise typer.Exit(1)


@sandbox_app.command(
    epilog=examples(
        "orchard sandbox rm $ID",
        "orchard sandbox rm $ID1 $ID2",
        "orchard sandbox rm --all --label run=a",
    )
)
def rm(
    ctx: typer.Context,
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
        fail("bad_request", "name sandboxes to remove, or pass --all")
    with connect(ctx) as client:
        if all_:
            ids += [sb.id for sb in client.sandboxes.list(labels=pairs(label, "--label"))]
        removed, failures = _delete_all(client, sorted(set(ids)))
    _report_removed(removed, failures, json_out)


@sandbox_app.command(
    epilog=examples("orchard sandbox gc", "orchard sandbox gc --label run=a --json")
)
def gc(
    ctx: typer.Context,
    label: Annotated[
        list[str] | None, typer.Option("--label", "-l", help="K=V filter, repeatable.")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Delete sandboxes that have exited, failed or outlived their timeout."""
    now = datetime.now(UTC)
    with connect(ctx) as client:
        stale = [
            sb.id
            for sb in client.sandboxes.list(labels=pairs(label, "--label"))
            if sb.info.status in ("exited", "failed") or sb.info.expires_at <= now
        ]
        removed, failures = _delete_all(client, stale)
    _report_removed(removed, failures, json_out)
