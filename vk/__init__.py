"""gpuferry's virtual kubelet: a virtual node on the consumer, twin pods on the provider.

``vk.forge`` holds the pure builders (names, ownership labels, twin pods, status back, fit);
``vk.reflection`` the reconcilers and what feeds them, ``vk.node`` the Node and its Lease,
``vk.kubelet`` the kubelet API. ``vk.remote`` is the one seam between a tenant's and an admin's
identity on the provider; ``vk.assembly`` wires it all on a :class:`kube.manager.Manager` and
``vk.app`` runs it. ``vk`` may import ``kube``, never ``peering`` or ``netfabric``: they meet only
through Kubernetes objects.
"""
