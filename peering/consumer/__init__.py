"""The consumer-side agent: runs the virtual kubelets of VirtualNodes and keeps them in step
with their grants (``python -m peering.consumer``)."""
