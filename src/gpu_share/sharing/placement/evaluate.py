"""One node for one pod: whether its host side rules the pod out, its best placement
there (``evaluate_node``), the devices that placement takes and the node after it.
``PodScores`` (the extender) and ``cluster`` (choosing among nodes) build on these.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import replace

from gpu_share.sharing.placement.cluster_policy import ClusterPolicy, DemandShape, Host, StateEval
from gpu_share.sharing.placement.fragmentation import amount
from gpu_share.sharing.placement.slots import (
    ContainerPlacement,
    DeviceSlot,
    NodeSlots,
    NoFit,
    NoFitCause,
    Placement,
    PodDemand,
)


def pod_shape(pod: PodDemand) -> DemandShape:
    return tuple((c.memory_units, c.cores) for c in pod.containers)


def _short(text: str, limit: int = 100) -> str:
    """Requirements can come from tenants: never echo them unbounded."""
    return text if len(text) <= limit else text[:limit] + "..."


def host_nofit(node: NodeSlots, pod: PodDemand) -> NoFit | None:
    """Why the node's device model or host resources rule the pod out, or None."""
    if node.unavailable:
        return NoFit(node.name, f"no new slice on this node: {node.unavailable}",
                     NoFitCause.ENFORCEMENT)
    if not pod.models.allows(node.model):
        return NoFit(
            node.name,
            f"device model {node.model or 'unknown'!r} is not one the pod accepts"
            f" ({_short(str(pod.models))})",
            NoFitCause.MODEL,
        )
    if node.cpu_free is not None and pod.cpu > node.cpu_free:
        return NoFit(
            node.name,
            f"insufficient cpu ({node.cpu_free}m free, {pod.cpu}m requested)",
            NoFitCause.CPU,
        )
    if node.host_memory_free is not None and pod.host_memory > node.host_memory_free:
        return NoFit(
            node.name,
            f"insufficient memory ({node.host_memory_free}Mi free, {pod.host_memory}Mi requested)",
            NoFitCause.MEMORY,
        )
    return None


def host_fits(node: NodeSlots, pod: PodDemand) -> str | None:
    """Why the node's device model or host resources rule the pod out, or None."""
    got = host_nofit(node, pod)
    return None if got is None else got.reason


def model_free(nodes: Iterable[NodeSlots]) -> dict[str, float]:
    """Free GPU-milli of healthy devices per device model (for ``ClusterPolicy.prices``)."""
    out: dict[str, float] = {}
    for n in nodes:
        out[n.model] = out.get(n.model, 0.0) + sum(amount(d.key) for d in n.devices if d.healthy)
    return out


def no_fit_reason(node: NodeSlots, pod: PodDemand) -> str:
    """A person-readable reason why no device set of ``node`` fits ``pod``."""
    healthy = [d for d in node.devices if d.healthy]
    if not healthy:
        return "no healthy device"
    big_mem = max(d.memory_free for d in healthy)
    big_core = max(d.cores_free for d in healthy)
    whole = sum(1 for d in healthy if d.whole_free)
    parts = ", ".join(
        f"{c.container}: {c.memory_units} memory units/{c.cores} cores"
        for c in pod.containers
        if not c.empty
    )
    return (
        f"no single device fits ({parts}); largest free block is {big_mem} memory "
        f"units and {big_core} cores, {whole} device(s) wholly free"
    )


def host_of(
    node: NodeSlots,
    pod: PodDemand,
    prices: Mapping[str, float] | None = None,
    shape: DemandShape | None = None,
) -> Host:
    """``shape``: ``pod_shape(pod)`` when the caller has it (one pod, many nodes)."""
    return Host(
        node.cpu_free,
        node.host_memory_free,
        pod.cpu,
        pod.host_memory,
        model=node.model,
        price=(prices or {}).get(node.model, 0.0),
        cpu_total=node.cpu_total,
        memory_total=node.host_memory_total,
        held=node.held,
        shape=pod_shape(pod) if shape is None else shape,
    )


def realise(node: NodeSlots, pod: PodDemand, ev: StateEval) -> Placement:
    """Turn a state-level evaluation into concrete devices of ``node`` (lowest index
    among devices in the chosen state) and the node's state after placement."""
    devs = {d.index: d for d in node.devices}
    out: list[ContainerPlacement] = []
    steps = iter(ev.steps)
    for c in pod.containers:
        if c.empty:
            continue
        step = next(steps)
        picked: list[DeviceSlot] = []
        for key in step.taken:
            d = min(
                (
                    x
                    for x in devs.values()
                    if x.healthy and x.key == key and x.index not in {p.index for p in picked}
                ),
                key=lambda x: x.index,
            )
            picked.append(d)
        for d in picked:
            devs[d.index] = replace(
                d,
                memory_free=d.memory_free - step.memory_units,
                cores_free=d.cores_free - step.cores,
            )
        out.append(ContainerPlacement(c.container, tuple(picked), step.memory_units, step.cores))
    return Placement(node.name, tuple(out), ev.score)


def apply(node: NodeSlots, pod: PodDemand, placement: Placement) -> NodeSlots:
    """The node after ``placement`` (devices and host resources consumed)."""
    devs = {d.index: d for d in node.devices}
    for cp in placement.containers:
        for d in cp.devices:
            cur = devs[d.index]
            if cur.memory_free < cp.memory_units or cur.cores_free < cp.cores:
                raise ValueError(f"placement over capacity on {node.name} device {d.index}")
            devs[d.index] = replace(
                cur,
                memory_free=cur.memory_free - cp.memory_units,
                cores_free=cur.cores_free - cp.cores,
            )
    shape = pod_shape(pod)
    return replace(
        node,
        devices=tuple(devs[i] for i in sorted(devs)),
        cpu_free=None if node.cpu_free is None else node.cpu_free - pod.cpu,
        host_memory_free=(
            None if node.host_memory_free is None else node.host_memory_free - pod.host_memory
        ),
        held=node.held | {shape} if placement.containers else node.held,
    )


def evaluate_node(
    policy: ClusterPolicy,
    node: NodeSlots,
    pod: PodDemand,
    prices: Mapping[str, float] | None = None,
) -> Placement | NoFit:
    """The best placement of ``pod`` on ``node`` alone, or why there is none.
    ``prices``: ``policy.prices(model_free(nodes))`` over the nodes being compared."""
    why = host_nofit(node, pod)
    if why is not None:
        return why
    ev = policy.evaluate(node.state, pod_shape(pod), host_of(node, pod, prices))
    if ev is None:
        return NoFit(node.name, no_fit_reason(node, pod))
    return realise(node, pod, ev)


def node_key(node: NodeSlots) -> Hashable:
    """Everything of ``node`` that ``evaluate_node``'s fit, score and reasons depend on
    (the name only labels a NoFit; ``no_fit_reason`` reads healthy devices' keys, which
    the state holds): nodes with equal keys get the same answer for any pod."""
    return (
        node.state,
        node.model,
        node.cpu_free,
        node.host_memory_free,
        node.cpu_total,
        node.host_memory_total,
        node.held,
        node.unavailable,
    )
