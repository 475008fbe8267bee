"""ResourceClaimTemplates the admission webhook's pods refer to (DRA mode).

``ensure`` makes a template exist in its namespace before the webhook admits a pod that
names it: create it; 409 AlreadyExists is fine when the stored one asks the same
(``claim_translation.template_matches``), anything else named so is refused
(``TemplateConflict``): a pod must never get a claim from a template someone else wrote
(a selector or admin access slipped in). Templates seen fine are remembered for
``cache_ttl_s``, so a busy namespace costs no API call per pod.

``OptInNamespaces`` answers whether a namespace carries the opt-in label. The API
server calls the webhook only for such namespaces (its namespaceSelector), but anyone who
reaches the webhook's port can send a review naming any namespace: the webhook checks the
label itself before it creates anything there.

Every call is bounded: the client's connect/read timeouts (short by default: the API
server waits ``timeoutSeconds`` for the whole webhook) and the caller's ``deadline``.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from gpu_share.errors import KubeAccessError
from gpu_share.kube.rest import ApiError, KubeTimeouts, RestClient, quote_name
from gpu_share.sharing.dra.claim_translation import API_VERSION, template_matches

__all__ = [
    "WEBHOOK_RULES",
    "WEBHOOK_TIMEOUTS",
    "ClaimTemplates",
    "OptInNamespaces",
    "TemplateConflict",
    "namespace_path",
    "templates_path",
]

# API permissions of the webhook, (apiGroup, resource, verbs): all it calls. The chart's
# webhook ClusterRole mirrors it (the L3 test runs the webhook with exactly these).
WEBHOOK_RULES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("resource.k8s.io", "resourceclaimtemplates", ("create", "get")),
    ("", "namespaces", ("get",)),
)

# The API server waits timeoutSeconds (5 s) for the webhook. Calls start only within
# the webhook's budget (2 s by default) and each takes at most connect + read: 4.5 s.
WEBHOOK_TIMEOUTS = KubeTimeouts(connect=1.0, read=1.5)


class TemplateConflict(KubeAccessError):
    """A template of that name exists and asks something else."""

    reason = "TemplateConflict"


def templates_path(namespace: str, name: str | None = None) -> str:
    path = f"/apis/{API_VERSION}/namespaces/{quote_name(namespace)}/resourceclaimtemplates"
    return path if name is None else f"{path}/{quote_name(name)}"


def namespace_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{quote_name(namespace)}"


class _SeenCache:
    """Keys seen fine in the last ``ttl`` seconds, at most ``limit`` of them (thread-safe)."""

    def __init__(self, ttl: float, limit: int, clock: Callable[[], float]) -> None:
        self._ttl, self._max, self._clock = ttl, limit, clock
        self._lock = threading.Lock()
        self._seen: OrderedDict[tuple[str, str], float] = OrderedDict()  # -> seen at

    def fresh(self, key: tuple[str, str]) -> bool:
        with self._lock:
            at = self._seen.get(key)
            if at is None:
                return False
            if self._clock() - at < self._ttl:
                return True
            del self._seen[key]
            return False

    def remember(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._seen[key] = self._clock()
            self._seen.move_to_end(key)
            while len(self._seen) > self._max:
                self._seen.popitem(last=False)

    def forget(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._seen.pop(key, None)

    def __len__(self) -> int:
        return len(self._seen)

    def __contains__(self, key: object) -> bool:
        return key in self._seen


def _in_time(deadline: float | None, clock: Callable[[], float], what: str) -> None:
    if deadline is not None and clock() >= deadline:
        raise KubeAccessError(f"no time left to {what}")


class _BoundedCalls:
    """The webhook's API client with short timeouts, its clock, and a cache of answers
    seen fine (shared by the namespace check and the templates)."""

    def __init__(
        self,
        api: RestClient,
        *,
        timeouts: KubeTimeouts | None = WEBHOOK_TIMEOUTS,
        cache_ttl_s: float = 30.0,
        max_cached: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api if timeouts is None else replace(api, timeouts=timeouts)
        self._clock = clock
        self._seen = _SeenCache(cache_ttl_s, max_cached, clock)


class _ReadBudget:
    """A token bucket of API reads: ``rate`` a second, ``burst`` at once (thread-safe)."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float]) -> None:
        self._rate, self._burst, self._clock = rate, float(burst), clock
        self._tokens, self._at = float(burst), clock()
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            now = self._clock()
            self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
            self._at = now
            if self._tokens < 1.0:
                return False
            self._tokens -= 1.0
            return True


class OptInNamespaces(_BoundedCalls):
    """``opted_in(namespace)``: does the namespace carry label ``key`` = ``value``?

    A yes is remembered for ``cache_ttl_s``, a no for ``no_ttl_s`` (short: a namespace
    just labelled counts within seconds), and reads of namespaces not remembered are
    bounded to ``reads_per_s`` (burst ``read_burst``): anyone who reaches the webhook can
    send reviews naming namespaces, and each would cost an API read under the webhook's
    identity. Past the budget the review is refused (KubeAccessError), not read."""

    def __init__(self, api: RestClient, key: str, value: str, *, no_ttl_s: float = 5.0,
                 reads_per_s: float = 20.0, read_burst: int = 40, **kw: Any) -> None:
        super().__init__(api, **kw)
        self.label = (key, value)
        self._no = _SeenCache(no_ttl_s, kw.get("max_cached", 4096), self._clock)
        self._budget = _ReadBudget(reads_per_s, read_burst, self._clock)

    def opted_in(self, namespace: str, deadline: float | None = None) -> bool:
        """Raises KubeAccessError (unreachable, ``deadline`` passed, over the read budget)
        or ApiError (e.g. 403)."""
        if self._seen.fresh(("", namespace)):
            return True
        if self._no.fresh(("", namespace)):
            return False
        _in_time(deadline, self._clock, f"read namespace {namespace}")
        if not self._budget.take():
            raise KubeAccessError(f"namespace reads over their budget; {namespace} not read")
        try:
            ns = self._api.get(f"get namespace {namespace}", namespace_path(namespace))
        except ApiError as e:
            if e.status == 404:
                self._no.remember(("", namespace))
                return False
            raise
        labels = ns.get("metadata", {}).get("labels") if isinstance(ns, dict) else None
        key, value = self.label
        if isinstance(labels, dict) and labels.get(key) == value:
            self._seen.remember(("", namespace))
            return True
        self._no.remember(("", namespace))
        return False


class ClaimTemplates(_BoundedCalls):
    """Creates and checks templates through ``api`` (thread-safe)."""

    def ensure_all(self, bodies: Iterable[Mapping[str, Any]], deadline: float | None = None
                   ) -> None:
        """``ensure`` each; ``deadline`` (``clock`` time) is checked before each call."""
        for body in bodies:
            self.ensure(body, deadline)

    def ensure(self, body: Mapping[str, Any], deadline: float | None = None) -> str:
        """Make ``body`` (a ``template_body``) exist: "cached", "created" or "exists".
        Raises TemplateConflict, ApiError (e.g. 403) or KubeAccessError (unreachable,
        or ``deadline`` passed)."""
        meta = body["metadata"]
        ns, name = str(meta["namespace"]), str(meta["name"])
        if self._seen.fresh((ns, name)):
            return "cached"
        self._in_time(deadline, ns, name)
        try:
            self._api.create(f"create resourceclaimtemplate {ns}/{name}",
                             templates_path(ns), dict(body))
        except ApiError as e:
            if e.status != 409:
                raise
            self._in_time(deadline, ns, name)
            self._verify(body, ns, name)
            self._seen.remember((ns, name))
            return "exists"
        self._seen.remember((ns, name))
        return "created"

    def forget(self, namespace: str, name: str) -> None:
        self._seen.forget((namespace, name))

    def _verify(self, body: Mapping[str, Any], ns: str, name: str) -> None:
        try:
            stored = self._api.get(f"get resourceclaimtemplate {ns}/{name}",
                                   templates_path(ns, name))
        except ApiError as e:
            if e.status == 404:  # deleted between our create and get: the pod's next try
                raise KubeAccessError(f"resourceclaimtemplate {ns}/{name} was deleted "
                                      "while it was being created; retry") from e
            raise
        if not template_matches(body, stored):
            raise TemplateConflict(
                f"resourceclaimtemplate {ns}/{name} exists and asks something other than "
                "gpu-share's template of that name; delete or rename it"
            )

    def _in_time(self, deadline: float | None, ns: str, name: str) -> None:
        _in_time(deadline, self._clock, f"ensure resourceclaimtemplate {ns}/{name}")
