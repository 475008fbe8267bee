"""The extender's binder (``extender.ports.Binder``) on the API server."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from gpu_share.errors import BindRefused
from gpu_share.kube.rest import MERGE_PATCH, ApiError, KubeTimeouts, RestClient, quote_name


class KubeBinder:
    """``extender.ports.Binder``: annotate (uid-checked merge patch), then bind."""

    def __init__(self, api: RestClient, timeouts: KubeTimeouts | None = None) -> None:
        # ``timeouts`` replace the client's own when given.
        self._api = api if timeouts is None else replace(api, timeouts=timeouts)

    def annotate_and_bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]
    ) -> None:
        ns = f"/api/v1/namespaces/{quote_name(namespace)}"
        if annotations:
            op = f"annotate pod {namespace}/{name}"
            # metadata.uid in the patch makes the server refuse a same-named new pod.
            body = {"metadata": {"uid": uid, "annotations": dict(annotations)}}
            try:
                self._api.patch(op, f"{ns}/pods/{quote_name(name)}", body,
                                content_type=MERGE_PATCH)
            except ApiError as e:
                raise _bind_error(e) from e
        op = f"bind pod {namespace}/{name} to {node}"
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            # .../bindings (authorized as resource "bindings"), as kube-scheduler posts.
            self._api.create(op, f"{ns}/bindings", binding)
        except ApiError as e:
            raise _bind_error(e) from e


def _bind_error(err: ApiError) -> Exception:
    """A 4xx answer means the call did nothing (BindRefused); a 5xx may have been
    applied (an etcd write that timed out), so its outcome stays unknown."""
    if 400 <= err.status < 500:
        return BindRefused(str(err))
    return err
