"""The virtual node: its Node object, its Lease heartbeat, and the provider's free room."""
