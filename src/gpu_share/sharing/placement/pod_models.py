"""Which GPU models a pod accepts, from its spec and annotations (pure).

Users already say it the Kubernetes way: a nodeSelector or required node affinity on
the node's GPU-product label (``nvidia.com/gpu.product`` by default, the label NVIDIA's
GPU feature discovery sets), and kube-scheduler enforces that on its own. What the
extender adds: the fragmentation workload knows each pod's requirement (so placement can
keep scarce models for the pods that need them), and a pod may list models in the
annotation ``gpu-share.<domain>/models`` (``"A100-SXM4-80GB,H100-80GB-HBM3"``; "|" also
separates) where no product label exists: the extender filters on that itself.

A node's model is its product label's value, else its devices' model from the agent's
inventory annotation in label form (NVML's "Tesla T4" reads "Tesla-T4").

Only ``In`` and ``NotIn`` on the product label narrow the models; other operators
(``Exists``, ``Gt``...) are left to kube-scheduler. Terms of a node affinity are ORed,
everything else ANDed, as kube-scheduler does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpu_share.sharing.placement.gpu_models import (
    ANY_MODEL,
    MAX_MODELS,
    MAX_NAME,
    ModelReq,
    ModelTerm,
    label_form,
)

DEFAULT_MODEL_LABEL = "nvidia.com/gpu.product"
MAX_ANNOTATION = 4096  # characters of the models annotation (tenant-written)
MAX_TERMS = 64  # node-affinity terms looked at


def models_key(domain: str) -> str:
    return f"gpu-share.{domain}/models"


def node_model(labels: Mapping[str, Any] | None, label: str, inventory_model: str) -> str:
    """The node's model as requirements name it (label first, then the inventory)."""
    value = (labels or {}).get(label)
    if isinstance(value, str) and value:
        return value
    return label_form(inventory_model)


def _map(v: Any, what: str) -> Mapping[str, Any]:
    """``v`` as a mapping (None = empty); the API server guarantees the types, a direct
    caller may not."""
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise ValueError(f"{what} must be an object")
    return v


def _values(expr: Mapping[str, Any]) -> frozenset[str]:
    vals = expr.get("values") or []
    if not isinstance(vals, list) or len(vals) > MAX_MODELS:
        raise ValueError(f"node affinity values must be a list of at most {MAX_MODELS}")
    return frozenset(label_form(str(v)[:MAX_NAME]) for v in vals)


def _term(term: Any, label: str) -> ModelTerm:
    """One node-selector term, as far as the product label goes."""
    out = ModelTerm()
    exprs = _map(term, "nodeSelectorTerm").get("matchExpressions") or []
    if not isinstance(exprs, list):
        raise ValueError("matchExpressions must be a list")
    for expr in exprs:
        if not isinstance(expr, Mapping) or expr.get("key") != label:
            continue
        op = expr.get("operator")
        if op == "In":
            out = out.both(ModelTerm(_values(expr)))
        elif op == "NotIn":
            out = out.both(ModelTerm(None, _values(expr)))
    return out


def _affinity(spec: Mapping[str, Any], label: str) -> ModelReq:
    node_aff = _map(_map(spec.get("affinity"), "affinity").get("nodeAffinity"), "nodeAffinity")
    required = _map(
        node_aff.get("requiredDuringSchedulingIgnoredDuringExecution"), "required node affinity"
    )
    terms = required.get("nodeSelectorTerms") or []
    if not isinstance(terms, list) or not terms:
        return ANY_MODEL
    if len(terms) > MAX_TERMS:
        raise ValueError(f"more than {MAX_TERMS} node affinity terms")
    return ModelReq.of(_term(t, label) for t in terms)


def pod_models(pod: Mapping[str, Any], label: str, domain: str) -> ModelReq:
    """The models ``pod`` accepts (ANY_MODEL when it says nothing). Raises ValueError
    on a malformed models annotation or affinity."""
    spec = _map(pod.get("spec"), "spec")
    req = ANY_MODEL
    selected = _map(spec.get("nodeSelector"), "nodeSelector").get(label)
    if selected is not None:
        value = str(selected)[:MAX_NAME]
        req = req.both(ModelReq.listed([value]) if value else _NONE)
    req = req.both(_affinity(spec, label))
    meta = _map(pod.get("metadata"), "metadata")
    text = _map(meta.get("annotations"), "annotations").get(models_key(domain))
    if text is not None:
        if not isinstance(text, str) or len(text) > MAX_ANNOTATION:
            raise ValueError(
                f"annotation {models_key(domain)} is not text of at most {MAX_ANNOTATION} chars"
            )
        listed = ModelReq.parse(text)
        if listed.any:
            raise ValueError(f"annotation {models_key(domain)} lists no model")
        req = req.both(listed)
    return req


def models_or_any(pod: Mapping[str, Any], label: str, domain: str) -> ModelReq:
    """``pod_models`` for the workload mix: a malformed requirement counts as "any"
    (the extender's filter refuses that pod itself)."""
    try:
        return pod_models(pod, label, domain)
    except ValueError:
        return ANY_MODEL


_NONE = ModelReq((ModelTerm(frozenset()),))  # no model at all (an empty selector value)
