"""Orchard Env: sandboxes for agents. This package is the client side and what it shares
with the service: the SDK (`sdk`), the wire models (`models`, `wire`), errors, settings
and the lean HTTP/1.1 transports (`http11`). The service is `env.server` (the `server`
extra), the backends `env.backends`; docs/architecture.md maps the rest."""
