"""gpuferry's virtual kubelet: a virtual node on the consumer, twin pods on the provider.

``vk.forge`` holds the pure builders (names, ownership labels, twin pods, status back, fit);
reflection, the node and the kubelet API build on them. ``vk`` may import ``kube``, never
``peering`` or ``netfabric``: they meet only through Kubernetes objects.
"""
