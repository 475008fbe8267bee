"""The node's ResourceSlice on the API server (DRA, resource.k8s.io/v1), over kube.rest.

``publish`` makes the API server hold exactly one slice of this node and driver saying
``content``: it lists the node's slices of the driver (field selector), keeps one of our
pool, creates it when there is none (``generateName``) or updates it (with its
``resourceVersion``) when its content digest differs, and deletes every other one. Each
write bumps the pool generation past every generation seen, so consumers never mix an
old slice with a new one. A 409 (someone else wrote in between) or a 404 (the slice went
away) re-reads and tries again, a bounded number of times. ``remove_all`` deletes every
slice of the node and driver (uninstall, clean exit).

Every call is bounded by the client's timeouts. Failures raise ``ResourceSliceError`` (a
``KubeAccessError``; ``status`` is the HTTP status, 0 for transport errors).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from gpu_share.errors import KubeAccessError
from gpu_share.kube.rest import ApiError, KubeTimeouts, RestClient, quote_name
from gpu_share.sharing.dra.slices import SliceContent, digest_annotation, slice_body

log = logging.getLogger(__name__)

__all__ = [
    "RESOURCE_SLICES",
    "PublishAction",
    "PublishResult",
    "ResourceSliceError",
    "ResourceSlicePublisher",
]

RESOURCE_SLICES = "/apis/resource.k8s.io/v1/resourceslices"
# Attempts of one publish when the API server answers 409 or 404 (a concurrent writer).
MAX_ATTEMPTS = 4
LIST_PAGE = 50
MAX_PAGES = 20  # our node has one slice; more only after a bug elsewhere


class ResourceSliceError(KubeAccessError):
    """Publishing or removing the node's ResourceSlice failed."""

    reason = "ResourceSlicePublishFailed"

    def __init__(self, message: str, *, status: int = 0, reason: str | None = None) -> None:
        super().__init__(message, reason=reason)
        self.status = status


class PublishAction(StrEnum):
    CREATED = "created"
    UPDATED = "updated"
    UNCHANGED = "unchanged"


@dataclass(frozen=True)
class PublishResult:
    action: PublishAction
    name: str
    generation: int
    deleted: int = 0  # extra slices removed


class _Retry(Exception):
    """A concurrent change: read again."""


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _pool(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec")
    pool = spec.get("pool") if isinstance(spec, Mapping) else None
    return pool if isinstance(pool, Mapping) else {}


def _generation(obj: Mapping[str, Any]) -> int:
    g = _pool(obj).get("generation")
    return g if isinstance(g, int) and not isinstance(g, bool) else 0


def _name(obj: Mapping[str, Any]) -> str:
    return str(_meta(obj).get("name") or "")


class ResourceSlicePublisher:
    """The node's slice of one driver. Thread-safe (one publish at a time)."""

    def __init__(
        self,
        api: RestClient,
        *,
        node_name: str,
        driver: str,
        timeouts: KubeTimeouts | None = None,
        max_attempts: int = MAX_ATTEMPTS,
    ) -> None:
        if not node_name or not driver:
            raise ValueError("node_name and driver are required")
        # ``timeouts`` replace the client's own when given.
        self._api = api if timeouts is None else replace(api, timeouts=timeouts)
        self.node_name = node_name
        self.driver = driver
        self._max_attempts = max(1, max_attempts)
        self._lock = threading.Lock()
        # Highest generation written by this process: stays monotonic even when our slice
        # was deleted behind our back.
        self._last_generation = 0

    # ---------------------------------------------------------------- reads

    def list_own(self) -> list[dict[str, Any]]:
        """Every slice of this node and driver (sorted by name). Raises ResourceSliceError."""
        query: dict[str, Any] = {
            "fieldSelector": f"spec.nodeName={self.node_name},spec.driver={self.driver}",
            "limit": LIST_PAGE,
        }
        out: list[dict[str, Any]] = []
        for _ in range(MAX_PAGES):
            page = self._call("list", "GET", RESOURCE_SLICES, query=query)
            out += [i for i in page.get("items") or () if isinstance(i, dict)]
            cont = (page.get("metadata") or {}).get("continue")
            if not cont:
                break
            query["continue"] = cont
        return sorted(out, key=_name)

    # ---------------------------------------------------------------- writes

    def publish(self, content: SliceContent) -> PublishResult:
        """Make the API server hold exactly ``content`` for this node; see the module doc."""
        if (content.node_name, content.driver) != (self.node_name, self.driver):
            raise ValueError("content is for another node or driver")
        with self._lock:
            for attempt in range(1, self._max_attempts + 1):
                try:
                    return self._publish_once(content)
                except _Retry as e:
                    log.info("resource slice changed concurrently, reading again",
                             extra={"attempt": attempt, "why": str(e)})
            raise ResourceSliceError(
                f"publish resource slice of node {self.node_name}: still conflicting after"
                f" {self._max_attempts} attempts",
                status=409,
                reason="ResourceSliceConflict",
            )

    def remove_all(self) -> int:
        """Delete every slice of this node and driver; how many were deleted."""
        with self._lock:
            n = 0
            for obj in self.list_own():
                n += self._delete(_name(obj))
            return n

    # ---------------------------------------------------------------- internals

    def _publish_once(self, content: SliceContent) -> PublishResult:
        slices = self.list_own()
        keep = self._keeper(slices, content)
        extras = [s for s in slices if s is not keep]
        top = max([self._last_generation, *map(_generation, slices)])
        if keep is not None and not extras and self._current(keep, content, top):
            return PublishResult(PublishAction.UNCHANGED, _name(keep), _generation(keep))
        generation = top + 1
        if keep is None:
            written = self._write("create", "POST", RESOURCE_SLICES,
                                  slice_body(content, generation=generation))
            action = PublishAction.CREATED
        else:
            name = _name(keep)
            rv = str(_meta(keep).get("resourceVersion") or "")
            body = slice_body(content, generation=generation, name=name, resource_version=rv)
            written = self._write("update", "PUT", f"{RESOURCE_SLICES}/{quote_name(name)}", body)
            action = PublishAction.UPDATED
        self._last_generation = generation
        # The new generation is written first: from then on the extras are stale anyway.
        deleted = sum(self._delete(_name(s)) for s in extras)
        name = _name(written) or _name(keep or {})
        log.info("resource slice published", extra={
            "slice": name, "action": action.value, "generation": generation,
            "devices": len(content.devices), "deleted": deleted,
        })
        return PublishResult(action, name, generation, deleted)

    def _keeper(
        self, slices: list[dict[str, Any]], content: SliceContent
    ) -> dict[str, Any] | None:
        """The slice to keep: of our pool, preferably already saying ``content``."""
        ours = [s for s in slices if _pool(s).get("name") == self.node_name]
        same = [s for s in ours if self._digest_of(s) == content.digest]
        pick = same or ours
        return pick[0] if pick else None

    def _digest_of(self, obj: Mapping[str, Any]) -> str:
        ann = _meta(obj).get("annotations")
        return str(ann.get(digest_annotation(self.driver), "")) if isinstance(ann, Mapping) else ""

    def _current(self, obj: Mapping[str, Any], content: SliceContent, top: int) -> bool:
        pool = _pool(obj)
        return (
            self._digest_of(obj) == content.digest
            and pool.get("resourceSliceCount") == 1
            and _generation(obj) >= top
        )

    def _write(self, verb: str, method: str, path: str, body: Any) -> dict[str, Any]:
        try:
            return self._call(verb, method, path, body=body)
        except ResourceSliceError as e:
            if e.status in (404, 409):
                raise _Retry(f"{verb} answered {e.status}") from e
            raise

    def _delete(self, name: str) -> int:
        try:
            self._call("delete", "DELETE", f"{RESOURCE_SLICES}/{quote_name(name)}")
        except ResourceSliceError as e:
            if e.status == 404:
                return 0  # gone already
            raise
        log.info("resource slice deleted", extra={"slice": name})
        return 1

    def _call(
        self, verb: str, method: str, path: str, *, query: Mapping[str, Any] | None = None,
        body: Any = None,
    ) -> dict[str, Any]:
        op = f"{verb} resourceslices of node {self.node_name}"
        try:
            answer = self._api.request(op, method, path, query=query, body=body)
        except ApiError as e:
            raise ResourceSliceError(str(e), status=e.status, reason=e.reason) from e
        except KubeAccessError as e:
            raise ResourceSliceError(str(e), reason=e.reason) from e
        if not isinstance(answer, dict):
            raise ResourceSliceError(f"{op}: the answer is not an object")
        return answer
