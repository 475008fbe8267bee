"""gpu_share.kube: API server access (the only home of the ``kubernetes`` package).

Import from the submodules (client, pods, publish, rbac); this file stays empty so
that reading ``rbac`` does not load the kubernetes client.
"""
