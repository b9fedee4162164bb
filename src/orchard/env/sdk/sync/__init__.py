"""The synchronous client (`Orchard`) and its resources; `orchard.env.sdk` exports them."""
