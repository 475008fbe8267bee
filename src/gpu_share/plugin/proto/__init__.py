"""Generated protobuf/gRPC modules of the kubelet APIs; regenerate with hack/gen-proto.sh.

``deviceplugin_v1beta1_*``: device-plugin API v1beta1 (package ``v1beta1``).
``podresources_v1_*``: PodResources API v1 (package ``v1``).
"""
