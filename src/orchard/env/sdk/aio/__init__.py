"""The asynchronous client (`AsyncOrchard`) and its resources, the sync names awaited;
`orchard.env.sdk` exports them."""
