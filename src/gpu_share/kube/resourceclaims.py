"""ResourceClaims (``resource.k8s.io/v1``) read by the agent in DRA mode: one GET per
claim the kubelet asks to prepare, with the stdlib REST client (``kube.rest``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpu_share.errors import KubeAccessError
from gpu_share.kube.rest import ApiError, KubeTimeouts, RestClient, quote_name

__all__ = ["CLAIM_TIMEOUTS", "ClaimNotFoundError", "KubeClaimReader", "claim_path"]

RESOURCE_API = "/apis/resource.k8s.io/v1"
# The kubelet gives NodePrepareResources its own deadline; one slow read must not eat it.
CLAIM_TIMEOUTS = KubeTimeouts(connect=3.0, read=10.0)
# A claim is a few KiB (32 requests and results at most); anything larger is refused.
MAX_CLAIM_BYTES = 1 << 20


class ClaimNotFoundError(KubeAccessError):
    """The claim does not exist (deleted before the kubelet prepared it)."""

    reason = "ClaimNotFound"
    grpc_code = "NOT_FOUND"


def claim_path(namespace: str, name: str) -> str:
    return (f"{RESOURCE_API}/namespaces/{quote_name(namespace)}"
            f"/resourceclaims/{quote_name(name)}")


class KubeClaimReader:
    """``agent.dra.claims.ClaimSource`` over the API server."""

    def __init__(self, api: RestClient, *, timeouts: KubeTimeouts | None = CLAIM_TIMEOUTS,
                 max_body_bytes: int = MAX_CLAIM_BYTES) -> None:
        # Its own client (own bounds and idle connections), same server and credentials.
        self._api = replace(api, timeouts=timeouts or api.timeouts,
                            max_body_bytes=max_body_bytes)

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """The claim as JSON. Raises ClaimNotFoundError (404), ApiError (other HTTP
        errors) or KubeAccessError (unreachable, undecodable, too large)."""
        if not namespace or not name:
            raise KubeAccessError(f"get resourceclaim {namespace!r}/{name!r}: "
                                  "namespace and name are required", reason="ClaimNotFound")
        op = f"get resourceclaim {namespace}/{name}"
        try:
            obj = self._api.get(op, claim_path(namespace, name))
        except ApiError as e:
            if e.status == 404:
                raise ClaimNotFoundError(f"{op}: not found") from None
            raise
        if not isinstance(obj, dict):
            raise KubeAccessError(f"{op}: the answer is not an object")
        return obj

    def close(self) -> None:
        self._api.close()
