"""``gpu-share-webhook``: the DRA-mode mutating admission webhook (vcuda limits ->
ResourceClaims). See docs/dra.md."""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import ssl
import sys
import threading

from pydantic import ValidationError

from gpu_share.cli.server_flags import add_server_flags, server_limits
from gpu_share.config.model import AgentConfig, ResourcesConfig
from gpu_share.errors import KubeAccessError, UsageError
from gpu_share.kube.claim_templates import ClaimTemplates, OptInNamespaces
from gpu_share.kube.rest import make_rest_client
from gpu_share.observability.http import BoundedServer, ServerLimits
from gpu_share.sharing.dra.claim_translation import DEFAULT_DEVICE_CLASS, TranslationSettings
from gpu_share.sharing.model import ResourceNames
from gpu_share.webhook.http import WEBHOOK_LIMITS, make_server
from gpu_share.webhook.review import Mutator
from gpu_share.webhook.tls import ReloadingTLS

log = logging.getLogger("gpu_share.webhook")

DEFAULT_NAMESPACE_LABEL = "gpu-share.vendor.com/dra=enabled"
_LABEL_NAME = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?\Z")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?\Z")
DEFAULT_UNIT_MIB = int(AgentConfig.model_fields["memory_unit_mib"].default)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="gpu-share-webhook")
    env = os.environ.get
    ap.add_argument("--tls-cert-file", default=env("GPU_SHARE_WEBHOOK_TLS_CERT_FILE"),
                    help="serving certificate (PEM); reloaded when the file changes")
    ap.add_argument("--tls-key-file", default=env("GPU_SHARE_WEBHOOK_TLS_KEY_FILE"))
    ap.add_argument("--bind", default=env("GPU_SHARE_WEBHOOK_BIND", "0.0.0.0"))
    # String defaults: argparse converts them with ``type``, so a bad env value is a
    # usage error (exit 2), not a traceback.
    ap.add_argument("--port", type=int, default=env("GPU_SHARE_WEBHOOK_PORT", "8443"))
    ap.add_argument("--kubeconfig", default=env("KUBECONFIG"))
    ap.add_argument("--domain", default=env("GPU_SHARE_DOMAIN", "vendor.com"))
    ap.add_argument("--memory-name", default=env("GPU_SHARE_MEMORY_NAME", "vcuda-memory"))
    ap.add_argument("--core-name", default=env("GPU_SHARE_CORE_NAME", "vcuda-core"))
    ap.add_argument("--memory-unit-mib", type=int,
                    default=env("GPU_SHARE_MEMORY_UNIT_MIB", str(DEFAULT_UNIT_MIB)),
                    help="MiB per memory unit: the agents' memoryUnitMiB")
    ap.add_argument("--device-class", default=env("GPU_SHARE_DEVICE_CLASS",
                                                  DEFAULT_DEVICE_CLASS))
    ap.add_argument("--mark-for-extender", action="store_true",
                    default=env("GPU_SHARE_WEBHOOK_MARK_FOR_EXTENDER", "") == "true",
                    help="keep the vcuda keys of a translated pod at 0, so the gpu-share "
                         "scheduler extender ranks its nodes (the chart sets it with "
                         "scheduler.enabled)")
    add_server_flags(ap, "GPU_SHARE_WEBHOOK", WEBHOOK_LIMITS)
    ap.add_argument("--api-budget-seconds", type=float,
                    default=env("GPU_SHARE_WEBHOOK_API_BUDGET_SECONDS", "2"),
                    help="time to start API calls for one review (timeoutSeconds is 5)")
    ap.add_argument("--namespace-label", default=env("GPU_SHARE_WEBHOOK_NAMESPACE_LABEL",
                                                     DEFAULT_NAMESPACE_LABEL),
                    help="KEY=VALUE: the label of namespaces that opted in (the webhook "
                         "configuration's namespaceSelector); reviews for other "
                         "namespaces are denied")
    ap.add_argument("--client-ca-file", default=env("GPU_SHARE_WEBHOOK_CLIENT_CA_FILE"),
                    help="accept reviews only from clients with a certificate signed by "
                         "this CA (PEM): the API server's, where its admission config "
                         "gives it one; probes need none")
    ap.add_argument("--log-level", default=env("GPU_SHARE_LOG_LEVEL", "info"))
    return ap.parse_args(argv)


def settings_of(a: argparse.Namespace) -> TranslationSettings:
    """The translation settings, checked with the agent's rules, or UsageError."""
    try:
        ResourcesConfig(domain=a.domain, memory_name=a.memory_name, core_name=a.core_name)
        AgentConfig.model_validate({"memoryUnitMiB": a.memory_unit_mib})
    except ValidationError as e:
        why = "; ".join(str(err["msg"]) for err in e.errors())
        raise UsageError(f"invalid settings: {why}"[:500]) from None
    names = ResourceNames(f"{a.domain}/{a.memory_name}", f"{a.domain}/{a.core_name}")
    return TranslationSettings(names, a.memory_unit_mib, a.device_class,
                               mark_for_extender=a.mark_for_extender)


def namespace_label_of(a: argparse.Namespace) -> tuple[str, str]:
    """(key, value) of --namespace-label, or UsageError."""
    key, sep, value = str(a.namespace_label).partition("=")
    prefix, slash, name = key.rpartition("/")
    ok = (
        sep == "=" and name and _LABEL_NAME.match(name) and _LABEL_NAME.match(value)
        and (not slash or _DNS_SUBDOMAIN.match(prefix))
    )
    if not ok:
        raise UsageError("--namespace-label must be KEY=VALUE with a valid label key and "
                         "value")
    return key, value


def limits_of(a: argparse.Namespace) -> ServerLimits:
    return server_limits(a, WEBHOOK_LIMITS)


def _tls(a: argparse.Namespace) -> ReloadingTLS:
    if not a.tls_cert_file or not a.tls_key_file:
        raise UsageError("--tls-cert-file and --tls-key-file are required (the API server "
                         "calls webhooks over HTTPS only)")
    try:
        return ReloadingTLS(a.tls_cert_file, a.tls_key_file, client_ca=a.client_ca_file)
    except (OSError, ssl.SSLError) as e:
        raise UsageError(f"cannot load the TLS files: {e}") from None


def build(a: argparse.Namespace) -> BoundedServer:
    """The bound server; raises UsageError, KubeAccessError or OSError."""
    settings, limits, label = settings_of(a), limits_of(a), namespace_label_of(a)
    tls = _tls(a)
    if a.api_budget_seconds <= 0:
        raise UsageError("--api-budget-seconds must be positive")
    api = make_rest_client(a.kubeconfig)
    api.user_agent = "gpu-share-webhook"
    templates = ClaimTemplates(api)
    namespaces = OptInNamespaces(api, *label)
    mutator = Mutator(settings, templates.ensure_all, opted_in=namespaces.opted_in,
                      budget_s=a.api_budget_seconds)
    return make_server(mutator, a.bind, a.port, ssl_context=tls.context, limits=limits,
                       require_client_cert=bool(a.client_ca_file))


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    logging.basicConfig(
        level=a.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        server = build(a)
    except UsageError as e:
        print(f"gpu-share-webhook: {e}", file=sys.stderr)
        return 2
    except KubeAccessError as e:
        print(f"gpu-share-webhook: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"gpu-share-webhook: cannot listen on {a.bind}:{a.port}: {e}", file=sys.stderr)
        return 1
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    log.info("serving on %s:%d (https)", *server.server_address)
    stop.wait()
    server.shutdown()
    server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
