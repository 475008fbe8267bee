"""gpu_share.kube: API server access, on one client (``kube.rest``; no ``kubernetes``).

Import from the submodules (rest, pods, publish, rbac); this file stays empty so that
reading ``rbac`` loads no client.
"""
