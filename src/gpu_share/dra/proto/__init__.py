"""Generated protobuf/gRPC modules of the kubelet DRA APIs; regenerate with hack/gen-proto.sh.

``dra_v1_*``: DRA plugin API v1 (package ``k8s.io.kubelet.pkg.apis.dra.v1``).
``dra_v1beta1_*``: DRA plugin API v1beta1 (package ``k8s.io.kubelet.pkg.apis.dra.v1beta1``).
``pluginregistration_v1_*``: plugin-watcher registration (package ``pluginregistration``).
"""
