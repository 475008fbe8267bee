"""Names of the DRA claims the admission webhook writes (pure): a container's pod claim
``gpu-share-<container>`` and the namespace's ResourceClaimTemplate
``gpu-share-m<memory units>-c<cores>`` it is made from. The webhook writes them
(``dra.claim_translation``); the extender reads a DRA pod's slice back from them
(``placement.pod_request``) to place it. Tenants can write these names too: a reader
takes only the exact grammar, with bounded numbers, and placement is all it informs
(the scheduler's allocator, not the name, decides what a claim gets)."""

from __future__ import annotations

import re

CLAIM_PREFIX = "gpu-share-"
_TEMPLATE = re.compile(r"gpu-share-m(0|[1-9][0-9]{0,11})-c(0|[1-9][0-9]{0,11})\Z", re.ASCII)


def template_name(memory_units: int, cores: int) -> str:
    return f"{CLAIM_PREFIX}m{memory_units}-c{cores}"


def template_shape(name: object) -> tuple[int, int] | None:
    """(memory units, cores) a template of that name asks, or None for any other name."""
    m = _TEMPLATE.match(name) if isinstance(name, str) else None
    return None if m is None else (int(m.group(1)), int(m.group(2)))
