"""The extender's binder (``extender.ports.Binder``) on the API server."""

from __future__ import annotations

from collections.abc import Mapping

from kubernetes import client as k8s

from gpu_share.errors import BindRefused
from gpu_share.kube.client import KubeTimeouts, access_error, api_status, call_json


class KubeBinder:
    """``extender.ports.Binder``: annotate (uid-checked merge patch), then bind."""

    def __init__(self, api_client: k8s.ApiClient, timeouts: KubeTimeouts | None = None) -> None:
        self._core = k8s.CoreV1Api(api_client)
        self._t = timeouts or KubeTimeouts()

    def annotate_and_bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]
    ) -> None:
        if annotations:
            op = f"annotate pod {namespace}/{name}"
            # metadata.uid in the patch makes the server refuse a same-named new pod.
            body = {"metadata": {"uid": uid, "annotations": dict(annotations)}}
            try:
                call_json(
                    op, self._core.patch_namespaced_pod, name, namespace, body, timeouts=self._t
                )
            except k8s.ApiException as e:
                raise _bind_error(op, e) from e
        op = f"bind pod {namespace}/{name} to {node}"
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            call_json(
                op, self._core.create_namespaced_binding, namespace, binding, timeouts=self._t
            )
        except k8s.ApiException as e:
            raise _bind_error(op, e) from e


def _bind_error(op: str, exc: k8s.ApiException) -> Exception:
    """A 4xx answer means the call did nothing (BindRefused); a 5xx may have been
    applied (an etcd write that timed out), so its outcome stays unknown."""
    status = api_status(exc)
    err = access_error(op, exc)
    if status is not None and 400 <= status < 500:
        return BindRefused(str(err))
    return err
