"""The bind of a DRA pod: which devices its decision records.

kube-scheduler's allocator chose the devices (its PreBind wrote them into the claims
before the extender's bind runs). The decision annotation records them so the view
counts them at once, as it counts a device-plugin pod's: read from the claims when they
can be read, else the allocator's first fit predicted on the view (``first_fit``). A
DRA pod is never refused here: its devices are allocated already; at worst nothing is
recorded and the node agent's inventory shows the use once the claim is prepared.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpu_share.errors import GpuShareError
from gpu_share.extender.ports import ClaimSource, ClusterView
from gpu_share.sharing.dra.pod_claims import allocated_indices, claim_names
from gpu_share.sharing.placement import (
    ClusterPolicy,
    ContainerPlacement,
    NodeSlots,
    NoFit,
    Placement,
    PodDemand,
)
from gpu_share.sharing.placement.first_fit import FirstFitScores
from gpu_share.sharing.placement.fragmentation import whole_count

Claimed = Mapping[str, tuple[int, ...]]  # container -> device indices allocated to it


def claimed_devices(
    view: ClusterView, claims: ClaimSource, ns: str, name: str, node: str, driver: str
) -> Claimed | None:
    """Per container, the indices of our devices on ``node`` its claims were allocated;
    None when any of it cannot be read (the caller predicts instead)."""
    try:
        pod = view.pod(ns, name)
        if pod is None:
            return None
        out: dict[str, tuple[int, ...]] = {}
        for container, names in claim_names(pod).items():
            got = [allocated_indices(claims.get_claim(ns, n), driver, node) for n in names]
            if any(g is None for g in got):
                return None
            out[container] = tuple(i for g in got for i in g or ())
        return out
    except GpuShareError:  # unreachable, refused, not found: predict
        return None


def _from_claims(slots: NodeSlots, demand: PodDemand, claimed: Claimed) -> Placement | None:
    """What the claims hold of our devices on this node: a container whose claims hold
    none (another driver's devices, a tenant's own template under our name) records
    nothing; None when no container holds any."""
    by_index = {d.index: d for d in slots.devices}
    out = []
    for c in demand.containers:
        indices = claimed.get(c.container, ())
        if not indices or any(i not in by_index for i in indices):
            continue
        devices = tuple(by_index[i] for i in indices)
        if whole_count(c.memory_units, c.cores, devices[0].cores_total):
            m, cores = devices[0].memory_total, devices[0].cores_total
        else:
            m, cores = c.memory_units, c.cores
        out.append(ContainerPlacement(c.container, devices, m, cores))
    return Placement(slots.name, tuple(out), ()) if out else None


def dra_placement(
    slots: NodeSlots | None, demand: PodDemand, claimed: Claimed | None, policy: ClusterPolicy
) -> Placement | None:
    """The devices the decision records: the claims' when they could be read (a tenant's
    claims that hold none of ours record nothing: no phantom use in the view), else the
    predicted first fit; None: nothing recorded."""
    if slots is None:
        return None
    if claimed is not None:
        return _from_claims(slots, demand, claimed)
    p = FirstFitScores(policy, demand).placement(slots)
    return None if isinstance(p, NoFit) else p
