"""Peering: authentication, GPU slice negotiation, virtual node lifecycle and the gpuferry CLI."""
