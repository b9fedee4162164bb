"""`make demo`: Orchard Env end to end on the local Docker engine, narrated.

Builds a small Debian+Python image offline, starts the embedded service, creates a
batch of sandboxes, runs and streams commands, moves files, reaches a web server
in a sandbox with no network through the port proxy, shows egress `none` blocking
a connection, and deletes everything.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import httpx
from rich.console import Console

from orchard import Orchard
from orchard.env import images
from orchard.env.sdk import Sandbox

console = Console(highlight=False)


def step(title: str) -> None:
    console.print(f"\n[bold cyan]▶ {title}[/]")


def show(label: str, value: object) -> None:
    console.print(f"  [dim]{label}:[/] {value}")


def main() -> None:
    t_start = time.perf_counter()
    step("Building the Debian + Python image offline (mmdebstrap; cached after the first run)")
    image = images.debian_python_image()
    show("image", image)

    step("Starting the embedded Orchard service on the local Docker engine")
    with Orchard() as client:
        step("Creating 3 sandboxes in one batch (egress: none)")
        t0 = time.perf_counter()
        batch = client.sandboxes.create_batch(image, 3, labels={"demo": "1"})
        show("created", f"{len(batch)} sandboxes in {time.perf_counter() - t0:.2f} s")
        try:
            run_tour(client, batch[0], batch[1])
        finally:
            step("Deleting everything")
            for sb in batch:
                sb.delete()
            left = client.sandboxes.list(labels={"demo": "1"})
            show("sandboxes left", len(left))
    console.print(f"\n[bold green]Demo finished in {time.perf_counter() - t_start:.1f} s.[/]")


def run_tour(client: Orchard, sb: Sandbox, other: Sandbox) -> None:
    step(f"Running commands in {sb.id}")
    for cmd in ["python3 -c 'import sys; print(sys.version)'", "cat /etc/os-release | head -1"]:
        t0 = time.perf_counter()
        res = sb.exec(cmd)
        show(
            f"$ {cmd}",
            f"{res.stdout.strip()}  [dim](exit {res.exit_code}, "
            f"{(time.perf_counter() - t0) * 1000:.1f} ms)[/]",
        )
    res = sb.exec(["sh", "-c", "sleep 30 & sleep 30"], timeout_s=1)
    show(
        "a 1 s timeout on `sleep 30 & sleep 30`", f"exit {res.exit_code}, timed_out={res.timed_out}"
    )

    step("Streaming output as it happens")
    for ev in sb.exec_stream("for i in 1 2 3; do echo tick $i; sleep 0.3; done"):
        if ev.type == "stdout" and ev.data:
            show(f"{time.strftime('%H:%M:%S')} stdout", ev.data.strip())
        elif ev.type == "exit":
            show("exit", ev.exit_code)

    step("A background process that survives the client: read its output by offset")
    proc = sb.process.start("for i in $(seq 1 5); do echo line $i; sleep 0.1; done")
    time.sleep(0.25)
    first = sb.process.output(proc.id)
    show("first read", repr(first.data))
    sb.process.wait(proc.id, timeout_s=5)
    rest = sb.process.output(proc.id, offset=first.next_offset)
    show(f"rest from offset {first.next_offset}", repr(rest.data))

    step("Moving files")
    sb.files.write("/work/hello.py", b"print('hello from a file')\n")
    show("$ python3 /work/hello.py", sb.exec("python3 /work/hello.py").stdout.strip())
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "project"
        (src / "pkg").mkdir(parents=True)
        (src / "pkg" / "__init__.py").write_text("VALUE = 42\n")
        sb.files.upload_dir(src, "/work/project")
        show("uploaded a folder; listing", [e.name for e in sb.files.list("/work/project/pkg")])
        out = Path(d) / "back"
        sb.files.download_dir("/work/project", out)
        show("downloaded it back", sorted(str(p.relative_to(out)) for p in out.rglob("*")))

    step("A web server in a sandbox with no network, reached through the port proxy")
    sb.files.write("/srv/index.html", b"<h1>served from inside a sandbox</h1>\n")
    sb.process.start("python3 -m http.server 8000 --directory /srv")
    url = sb.port_url(8000)
    body = ""
    for _ in range(50):
        try:
            r = client.http.get(url)
            body = r.text.strip()
            if r.status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    show(f"GET {url}", body)

    step("Egress `none`: the sandbox has only loopback, so connections fail")
    show("interfaces", sb.exec("cat /proc/net/dev | tail -n +3 | cut -d: -f1").stdout.split())
    probe = (
        "import socket\n"
        "try:\n"
        "    socket.create_connection(('192.0.2.1', 80), timeout=2)\n"
        "    print('connected')\n"
        "except OSError as e:\n"
        "    print('blocked:', e)\n"
    )
    show("connect to an outside address", sb.exec(["python3", "-c", probe]).stdout.strip())
    show("other sandbox", f"{other.id} is untouched: {other.exec('echo ok').stdout.strip()}")


if __name__ == "__main__":
    main()
