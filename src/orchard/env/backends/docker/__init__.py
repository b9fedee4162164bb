"""The Docker backend: one container per sandbox on a local engine, the agent bind-mounted
read-only as its entrypoint.

`backend.py` (`DockerBackend`: containers, resources, egress), `images.py` (pulls, the
image cache, engine errors), `mounts.py` (the agent, its socket folder, volumes),
`state.py` (`docker pause`, commit snapshots, engine diffs). Chosen by name (`docker`)
through `orchard.env.backends.make_backend`.
"""
