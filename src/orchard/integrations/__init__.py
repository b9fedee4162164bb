"""Orchard inside other frameworks' plug-in points: one module per tool.

- `inspect`: an Inspect AI sandbox environment provider (`sandbox=("orchard", IMAGE)`).
- `harbor`: a Harbor environment (`--env orchard.integrations.harbor:OrchardEnvironment`).
- `openenv`: an OpenEnv container provider (`openenv_image` builds server images offline);
  `openenv_families`: Orchard families as OpenEnv environments (openenv-core's server app).
- `trl`, `verifiers`, `skyrl`: training-loop environments backed by Orchard sandboxes.

Every adapter talks to sandboxes only through the public SDK (`orchard.Orchard`,
`orchard.AsyncOrchard`), so each runs on a laptop's Docker engine (no URL: the service runs
in-process) or against a remote service (`ORCHARD_URL`, `ORCHARD_API_KEY`). Import the module
of the tool you use; each imports its tool, which `pip install 'orchard[integrations]'` brings.
"""
