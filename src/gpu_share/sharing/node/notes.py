"""Typed facts the engine found while deciding (for logs, metrics and Events).

The engine never logs; a call's result carries ``Note``s and the agent acts on their
``kind`` (never on their text, which is for people).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum


class NoteKind(StrEnum):
    # Placed without knowing the container, and why.
    DEGRADED_PODRESOURCES = "degraded-podresources"
    DEGRADED_APISERVER = "degraded-apiserver"
    DEGRADED_NO_CANDIDATE = "degraded-no-candidate"
    AMBIGUOUS = "ambiguous"  # other containers qualified for the call too
    OFFER_EXPIRED = "offer-expired"  # an abandoned offer was released
    STALE_RELEASED = "stale-released"  # a pod whose ids the kubelet lists as free
    EXTENDER_IGNORED = "extender-ignored"  # signed decision rejected or not followed
    BLIND_ATTRIBUTED = "blind-attributed"  # a blind decision named by a later call
    SECOND_HALF = "second-half"  # pod unknown now; its other half was decided known


# Metric label of the degraded counter per degraded kind (low cardinality).
DEGRADED_LABELS = {
    NoteKind.DEGRADED_PODRESOURCES: "podresources-unreachable",
    NoteKind.DEGRADED_APISERVER: "apiserver-unreachable",
    NoteKind.DEGRADED_NO_CANDIDATE: "no-candidate",
}


@dataclass(frozen=True)
class Note:
    kind: NoteKind
    text: str

    def __str__(self) -> str:
        return self.text


def degraded_label(notes: Iterable[Note]) -> str:
    """The degraded counter's label for a call's notes."""
    for n in notes:
        label = DEGRADED_LABELS.get(n.kind)
        if label is not None:
            return label
    return DEGRADED_LABELS[NoteKind.DEGRADED_NO_CANDIDATE]


def texts(notes: Iterable[Note]) -> list[str]:
    return [n.text for n in notes]
