"""The local backend: an OCI runtime (crun or runc) driven directly, root and no daemon.

`backend.py` (`LocalBackend`), `net.py` (the bridge, veth pairs), `mount_ns.py` (the rootfs
in a private mount namespace), `oci_images.py` (images unpacked once, shared read-only),
`oci_spec.py` (the runtime spec), `oci_runtime.py` (the runtime's commands and what it can
do), `runc_exe.py` / `runc_state.py` (runc from a sealed copy; what a dead sandbox leaves),
`spawn.py` / `spawner.py` (helper processes; children that mount first), `state.py`,
`memory.py` and `criu.py` (pause, snapshots, memory snapshots). Chosen by name (`local`).
"""
