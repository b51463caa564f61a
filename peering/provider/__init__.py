"""The provider side of peering: Tenants (identity), GPUSlices (grants), twin namespaces (enforcement).

Run it with ``python -m peering.provider --kubeconfig PROVIDER_ADMIN`` or in-process with
:func:`peering.provider.app.run_provider`. Modules:

* :mod:`.planning`, :mod:`.quotas`, :mod:`.builders` — pure: capacity and grant decisions, the
  partition of a grant into quotas, the objects made for a tenant;
* :mod:`.tenants` — verify the peering-token proof, issue the certificate, tenant RBAC, revoke;
* :mod:`.slices` — the GPU pool: every grant decided in one serialized pass;
* :mod:`.twins` — twin namespaces, their quotas (partitioned grant) and RBAC;
* :mod:`.app` — watches → queues → reconcilers as supervised root tasks.

What the consumer's identity (user ``gpuferry:consumer:<id>``, group ``gpuferry:consumers``)
gets: a Role in its tenant namespace (GPUSlices and NamespaceOffloadings: read/write, spec only;
its Tenant and Events: read; no Secrets) and a Role in each of its twin namespaces (pods with
log/exec/attach/portforward, configmaps, secrets, services, endpointslices: read/write; events,
resourcequotas, limitranges: read), each bound to the *user* by a RoleBinding. No ClusterRole and
no ClusterRoleBinding is created for it: nothing cluster-wide is needed beyond what every
authenticated user has (discovery, self-subject reviews).

What the controller itself needs on the provider (for a chart's ClusterRole): CSRs
(create/get/list/watch/delete), ``certificatesigningrequests/approval`` (update) and ``approve``
on ``signers`` named ``kubernetes.io/kube-apiserver-client``; namespaces (get/list/watch/create/
patch/delete); roles and rolebindings (get/list/create/patch/delete — plus every permission it
grants, or ``escalate``/``bind``); resourcequotas and limitranges (get/list/watch/create/patch);
nodes and pods (get/list/watch); secrets (get, for the peering token); tenants, gpuslices,
namespaceoffloadings and their ``/status`` (get/list/watch/patch/update).
"""
