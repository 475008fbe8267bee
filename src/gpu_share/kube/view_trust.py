"""Which of a pod's gpu-share annotations the extender's cluster view counts.

Pod annotations are tenant-writable, so a pod's ``decision`` and ``assignment`` count only
when their HMAC verifies under the extender's key (or a rotation's previous one) AND they
were signed for that pod's UID on the node it is bound to. Anything else is ignored,
counted in ``untrusted`` by reason and logged at most once a minute.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from gpu_share.sharing.annotations import (
    MALFORMED,
    AnnotationError,
    assignment_key,
    verify_assignment,
)
from gpu_share.sharing.decision import DecisionError, decision_key, under_any_key, verify_binding

log = logging.getLogger(__name__)
UNTRUSTED_LOG_EVERY_S = 60.0  # ignored annotations: one summary log line at most this often


class AnnotationTrust:
    """Judges a pod's decision and assignment annotations; counts what it ignores."""

    def __init__(
        self,
        domain: str,
        keys: tuple[bytes, ...],
        clock: Callable[[], float],
        on_untrusted: Callable[[str], None] | None = None,
    ) -> None:
        """``keys``: verify with any (a key rotation). ``on_untrusted(reason)``: called per
        ignored annotation (a metric hook)."""
        self._domain = domain
        self._keys = keys
        self._clock = clock
        self._on_untrusted = on_untrusted
        self.untrusted: Counter[str] = Counter()  # reason -> annotations ignored
        self._logged: tuple[float, int] = (float("-inf"), 0)

    def trusted(self, uid: str, node: str, pod: Mapping[str, Any]) -> dict[str, str]:
        """The pod's decision/assignment annotations that verify for (uid, node)."""
        ann = (pod.get("metadata") or {}).get("annotations") or {}
        out: dict[str, str] = {}
        if not node:
            return out  # annotated but not bound yet: nothing to count, nothing to judge
        checks: tuple[tuple[str, Callable[[str, bytes, str, str], object]], ...] = (
            (assignment_key(self._domain), verify_assignment),
            (decision_key(self._domain), verify_binding),
        )
        for key, check in checks:
            text = ann.get(key)
            if not isinstance(text, str) or not text:
                continue
            try:
                under_any_key(self._keys, partial(_verify, check, text, uid, node))
            except (AnnotationError, DecisionError) as e:
                self._ignored(e.reason, pod)
                continue
            except Exception:  # tenant input must never break the watch
                self._ignored(MALFORMED, pod)
                continue
            out[key] = text
        return out

    def _ignored(self, reason: str, pod: Mapping[str, Any]) -> None:
        self.untrusted[reason] += 1
        if self._on_untrusted is not None:
            try:
                self._on_untrusted(reason)
            except Exception:  # a broken metric hook must not break the watch
                log.exception("on_untrusted hook failed")
        now, total = self._clock(), sum(self.untrusted.values())
        last, seen = self._logged
        if now - last >= UNTRUSTED_LOG_EVERY_S:
            meta = pod.get("metadata") or {}
            who = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
            log.warning(
                "ignoring gpu-share annotations that do not verify (%s on pod %s; %d ignored "
                "since the last report, by reason: %s)",
                reason, who[:200], total - seen, dict(self.untrusted),
            )
            self._logged = (now, total)


def _verify(check: Callable[[str, bytes, str, str], object], text: str, uid: str, node: str,
            key: bytes) -> object:
    return check(text, key, uid, node)
