"""Every request the API server served during a stream, from all its clients (the
schedulers, kube-controller-manager, kwok, the extender, the bench), by verb and
resource: its ``apiserver_request_total`` counter read from /metrics before and after.

What a DRA pod costs the API server beyond a device-plugin pod (the claim made from its
template, the claim's allocation, the pod's claim status) shows up here per bound pod.
"""

from __future__ import annotations

import ssl
import urllib.request
from collections import Counter

from kubernetes import client, config
from prometheus_client.parser import text_string_to_metric_families

FAMILY = "apiserver_request"  # the counter apiserver_request_total


def request_counts(kubeconfig: str, timeout_s: float = 60) -> Counter[str]:
    """``"<VERB> <resource>[/<subresource>]"`` -> requests served so far."""
    cfg = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)  # type: ignore[no-untyped-call]
    ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert)
    if cfg.cert_file and cfg.key_file:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    req = urllib.request.Request(f"{cfg.host}/metrics")
    if cfg.api_key.get("authorization"):
        req.add_header("Authorization", cfg.api_key["authorization"])
    with urllib.request.urlopen(req, context=ctx, timeout=timeout_s) as resp:
        return parse(resp.read().decode())


def parse(text: str) -> Counter[str]:
    counts: Counter[str] = Counter()
    for fam in text_string_to_metric_families(text):
        if fam.name != FAMILY:
            continue
        for s in fam.samples:
            if not s.name.endswith("_total"):
                continue
            sub = s.labels.get("subresource", "")
            what = s.labels.get("resource", "") + (f"/{sub}" if sub else "")
            counts[f"{s.labels.get('verb', '')} {what}"] += int(s.value)
    return counts


def note(before: Counter[str], after: Counter[str], pods: int, top: int = 10) -> str:
    """The ``top`` kinds of request per bound pod, and all of them."""
    diff = after - before
    if not pods or not diff:
        return "API server requests per bound pod: -"
    head = ", ".join(f"{k} {v / pods:.2f}" for k, v in diff.most_common(top))
    return (f"API server requests per bound pod (all clients): {head}; "
            f"all {sum(diff.values()) / pods:.2f}")
