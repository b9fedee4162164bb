"""Every REST route the SDK sends, described once as a `Call`: one module per resource.

A function here builds the request (what to send, whether it is safe to retry, how to
parse the answer) and checks its arguments as the server would, before anything is sent;
`Orchard` and `AsyncOrchard` only send it. The clients use `calls.<name>`; the modules
are where each is read (and checked against docs/rest-api.md).
"""

from __future__ import annotations

from orchard.env.sdk.calls.exec import (
    ExecOptions,
    exec_call,
    exec_stream,
    parse_event,
)
from orchard.env.sdk.calls.files import (
    FileData,
    download_tar,
    list_files,
    mkdir,
    move_file,
    read_file,
    remove_file,
    stat_file,
    upload_tar,
    write_file,
)
from orchard.env.sdk.calls.pools import (
    PoolOptions,
    create_pool,
    delete_pool,
    get_pool,
    list_pools,
)
from orchard.env.sdk.calls.processes import (
    ProcessOptions,
    follow_process,
    get_process,
    list_processes,
    process_output,
    remove_process,
    resize_process,
    signal_process,
    start_process,
    wait_process,
    write_stdin,
)
from orchard.env.sdk.calls.sandboxes import (
    CreateOptions,
    create_batch,
    create_sandbox,
    delete_sandbox,
    get_sandbox,
    list_sandboxes,
    port_link,
    set_network,
    set_timeout,
)
from orchard.env.sdk.calls.service import (
    health,
    usage,
)
from orchard.env.sdk.calls.state import (
    delete_snapshot,
    diff,
    fork,
    get_snapshot,
    list_snapshots,
    pause,
    resume,
    snapshot,
)
from orchard.env.sdk.calls.volumes import (
    create_volume,
    delete_volume,
    get_volume,
    list_volumes,
)

__all__ = [
    "CreateOptions",
    "ExecOptions",
    "FileData",
    "PoolOptions",
    "ProcessOptions",
    "create_batch",
    "create_pool",
    "create_sandbox",
    "create_volume",
    "delete_pool",
    "delete_sandbox",
    "delete_snapshot",
    "delete_volume",
    "diff",
    "download_tar",
    "exec_call",
    "exec_stream",
    "follow_process",
    "fork",
    "get_pool",
    "get_process",
    "get_sandbox",
    "get_snapshot",
    "get_volume",
    "health",
    "list_files",
    "list_pools",
    "list_processes",
    "list_sandboxes",
    "list_snapshots",
    "list_volumes",
    "mkdir",
    "move_file",
    "parse_event",
    "pause",
    "port_link",
    "process_output",
    "read_file",
    "remove_file",
    "remove_process",
    "resize_process",
    "resume",
    "set_network",
    "set_timeout",
    "signal_process",
    "snapshot",
    "start_process",
    "stat_file",
    "upload_tar",
    "usage",
    "wait_process",
    "write_file",
    "write_stdin",
]
