"""Node GPU fragmentation against a target workload (the FGD measure, Weng et al. ATC'23).

For one shape m of the target workload, a node's fragment is the free GPU capacity m
cannot use there: all of it when m does not fit the node at all, otherwise the free part
of every device too small for m. The node's fragmentation is the popularity-weighted sum
over the shapes. Capacity is counted in GPU-milli equivalents: a device's free amount is
``1000 * (memFree/memTotal + coresFree/coresTotal) / 2``, so memory and cores weigh the
same and a fully free device is worth 1000.

Values depend only on the node's GPU state key, so they are memoised by it; a placement
changes one node, and only that node's new state needs computing.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass

from gpu_share.sharing.placement.gpu_models import ANY_MODEL, ModelPressure, ModelReq
from gpu_share.sharing.placement.memo import BoundedMemo
from gpu_share.sharing.placement.prices import SharePrices, grid, share_prices
from gpu_share.sharing.placement.slots import MILLI, DevKey, StateKey


def amount(d: DevKey) -> float:
    """Free capacity of one device in GPU-milli equivalents."""
    mf, cf, mt, ct = d
    if mt > 0 and ct > 0:
        return MILLI * (mf / mt + cf / ct) / 2
    if mt > 0:
        return MILLI * mf / mt
    return MILLI * cf / ct if ct > 0 else 0.0


def is_whole_free(d: DevKey) -> bool:
    return d[0] == d[2] and d[1] == d[3]


@dataclass(frozen=True)
class Shape:
    """One typical container request: ``cores >= a device's cores`` means
    ``cores // coresTotal`` whole devices. ``cpu``/``host_memory``: what the pod also
    needs from the host (0 = nothing / not tracked). ``models``: the device models it
    accepts."""

    memory_units: int
    cores: int
    weight: float
    cpu: int = 0
    host_memory: int = 0
    models: ModelReq = ANY_MODEL


def whole_count(memory_units: int, cores: int, cores_total: int) -> int:
    """How many whole devices the request takes (0 = a share of one device)."""
    if cores_total > 0 and cores >= cores_total:
        return cores // cores_total
    return 0


def fits_shared(d: DevKey, memory_units: int, cores: int) -> bool:
    mf, cf, _, ct = d
    return mf >= memory_units and cf >= cores and cores < ct


_Key = tuple[int, int, int, int, ModelReq]


def _key_order(item: tuple[_Key, float]) -> tuple[int, int, int, int, str]:
    m, c, cpu, hm, models = item[0]
    return (m, c, cpu, hm, str(models))


class Workload:
    """The target mix: shapes with popularity weights (normalised to sum 1).

    With model requirements, a device is kept useful for the shapes that can run on its
    model only: ``for_model(k)`` is the mix of the shapes that accept model k (weights
    renormalised), and ``pressure`` prices the capacity of models that bound shapes need.

    ``F(node) = total_free - sum_g U_g(gpu state) * P_g(cpu free, memory free)``: U_g is
    the free capacity GPU shape g can use (0 when g does not fit the devices), P_g the
    weight of g's shapes whose host needs fit. Both factors are memoised separately, so
    host-aware fragmentation costs one short dot product per node state.
    """

    def __init__(self, shapes: Iterable[Shape]) -> None:
        merged: dict[_Key, float] = {}
        for s in shapes:
            if s.weight > 0 and (s.memory_units > 0 or s.cores > 0):
                k = (s.memory_units, s.cores, s.cpu, s.host_memory, s.models)
                merged[k] = merged.get(k, 0.0) + s.weight
        total = sum(merged.values())
        self.shapes: tuple[Shape, ...] = tuple(
            Shape(m, c, w / total, cpu, hm, models)
            for (m, c, cpu, hm, models), w in sorted(merged.items(), key=_key_order)
        )
        self.constrained = any(not s.models.any for s in self.shapes)
        self.pressure = ModelPressure(self._model_demand())
        self._per_model: dict[str, Workload] = {}
        # A per-model view reads usable capacities from its parent (one memo for all).
        self._parent: Workload | None = None
        self._proj: tuple[int, ...] = ()
        gpu: dict[tuple[int, int], list[Shape]] = {}
        for s in self.shapes:
            gpu.setdefault((s.memory_units, s.cores), []).append(s)
        self.gpu_shapes: tuple[tuple[int, int], ...] = tuple(sorted(gpu))
        self._by_gpu: tuple[tuple[Shape, ...], ...] = tuple(tuple(gpu[g]) for g in self.gpu_shapes)
        self._all_host: tuple[float, ...] = tuple(sum(s.weight for s in g) for g in self._by_gpu)
        self._usable: BoundedMemo[StateKey, tuple[float, tuple[float, ...]]] = BoundedMemo()
        self._host: dict[tuple[int, int], tuple[float, ...]] = {}
        self._frag: BoundedMemo[tuple[StateKey, int, int], float] = BoundedMemo()
        self._ratio: dict[tuple[int, int], tuple[float, float]] = {}
        self._prices: dict[tuple[int, int], SharePrices] = {}
        self._loss: BoundedMemo[tuple[DevKey, int, int], float] = BoundedMemo()
        self._cpus = sorted({s.cpu for s in self.shapes})
        self._mems = sorted({s.host_memory for s in self.shapes})
        self.memo_limit = 200_000

    @classmethod
    def from_requests(cls, requests: Iterable[tuple[int, int]]) -> Workload:
        """Popularity = how often each (memory_units, cores) request occurs."""
        counts: dict[tuple[int, int], int] = {}
        for r in requests:
            counts[r] = counts.get(r, 0) + 1
        return cls(Shape(m, c, float(n)) for (m, c), n in counts.items())

    def __len__(self) -> int:
        return len(self.shapes)

    def for_model(self, model: str) -> Workload:
        """The shapes that can run on ``model`` (this workload when none is restricted)."""
        if not self.constrained:
            return self
        got = self._per_model.get(model)
        if got is None:
            got = Workload(s for s in self.shapes if s.models.allows(model))
            got.memo_limit = self.memo_limit
            got._parent = self
            got._proj = tuple(self.gpu_shapes.index(g) for g in got.gpu_shapes)
            self._per_model[model] = got
        return got

    def _model_demand(self) -> dict[ModelReq, float]:
        """Share of the GPU demand (in cores, i.e. device fractions) per requirement."""
        by_req: dict[ModelReq, float] = {}
        for s in self.shapes:
            by_req[s.models] = by_req.get(s.models, 0.0) + s.weight * s.cores
        total = sum(by_req.values())
        return {r: v / total for r, v in by_req.items()} if total > 0 else {}

    def usable(self, state: StateKey) -> tuple[float, tuple[float, ...]]:
        """(total free, free capacity each GPU shape can use) of a GPU state."""
        v = self._usable.get(state)
        if v is None:
            if self._parent is not None:
                total, usable = self._parent.usable(state)
                v = (total, tuple(usable[i] for i in self._proj))
            else:
                total = sum(amount(d) for d in state)
                frags = (self._gpu_fragment(state, m, c) for m, c in self.gpu_shapes)
                v = (total, tuple(total - f for f in frags))
            self._usable.put(state, v, self.memo_limit)
        return v

    def host_weights(self, cpu_free: int | None, memory_free: int | None) -> tuple[float, ...]:
        """P_g: weight of GPU shape g's shapes whose host needs fit. Memoised by how many
        of the workload's distinct CPU/memory needs fit (exact, and few keys)."""
        if cpu_free is None and memory_free is None:
            return self._all_host
        rc = len(self._cpus) if cpu_free is None else bisect.bisect_right(self._cpus, cpu_free)
        rm = (
            len(self._mems) if memory_free is None else bisect.bisect_right(self._mems, memory_free)
        )
        v = self._host.get((rc, rm))
        if v is None:
            max_cpu = self._cpus[rc - 1] if rc else -1
            max_mem = self._mems[rm - 1] if rm else -1
            v = tuple(
                sum(s.weight for s in g if s.cpu <= max_cpu and s.host_memory <= max_mem)
                for g in self._by_gpu
            )
            self._host[(rc, rm)] = v
        return v

    @staticmethod
    def _gpu_fragment(state: StateKey, m: int, c: int) -> float:
        total = 0.0
        frag = 0.0
        if not state:
            return 0.0
        k = whole_count(m, c, state[0][3])
        if k:
            whole = 0
            for d in state:
                a = amount(d)
                total += a
                if is_whole_free(d):
                    whole += 1
                else:
                    frag += a
            return frag if whole >= k else total
        fit = False
        for d in state:
            a = amount(d)
            total += a
            if fits_shared(d, m, c):
                fit = True
            else:
                frag += a
        return frag if fit else total

    def host_ratio(self, dev: DevKey) -> tuple[float, float]:
        """Mean host CPU and memory the workload asks per GPU-milli on such a device."""
        key = (dev[2], dev[3])
        got = self._ratio.get(key)
        if got is None:
            gpu = cpu = mem = 0.0
            for s in self.shapes:
                k = whole_count(s.memory_units, s.cores, dev[3])
                g = k * MILLI if k else amount((s.memory_units, s.cores, dev[2], dev[3]))
                gpu += s.weight * g
                cpu += s.weight * s.cpu
                mem += s.weight * s.host_memory
            got = (cpu / gpu, mem / gpu) if gpu > 0 else (0.0, 0.0)
            self._ratio[key] = got
        return got

    def prices(self, dev: DevKey) -> SharePrices:
        """Cutting-stock prices of the workload's shares on such a device (``prices.py``)."""
        key = (dev[2], dev[3])
        got = self._prices.get(key)
        if got is None:
            sizes: dict[float, float] = {}
            for s in self.shapes:
                if not whole_count(s.memory_units, s.cores, dev[3]):
                    a = amount((s.memory_units, s.cores, dev[2], dev[3]))
                    sizes[a] = sizes.get(a, 0.0) + s.weight
            unit = grid(list(sizes))
            demand: dict[int, float] = {}
            for a, w in sizes.items():
                k = max(1, math.ceil(a / unit - 1e-6))
                demand[k] = demand.get(k, 0.0) + w
            got = share_prices(demand, unit, MILLI // unit)
            self._prices[key] = got
        return got

    def share_loss(self, dev: DevKey, memory_units: int, cores: int) -> float:
        """Device value (fraction of a device) that a share of ``dev`` loses for good."""
        key = (dev, memory_units, cores)
        got = self._loss.get(key)
        if got is None:
            got = 0.0
            if not whole_count(memory_units, cores, dev[3]):
                size = amount((memory_units, cores, dev[2], dev[3]))
                got = self.prices(dev).loss(amount(dev), size)
            self._loss.put(key, got, self.memo_limit)
        return got

    def stranded(self, state: StateKey, cpu_free: int | None, memory_free: int | None) -> float:
        """Free GPU capacity the node's host CPU/memory cannot feed at the workload's
        average CPU and memory per GPU-milli: the long-run fragment FGD's one-step
        look-ahead misses (a GPU-free pod taking the CPU of a GPU-rich node)."""
        if not state or (cpu_free is None and memory_free is None):
            return 0.0
        total = (self._parent or self).usable(state)[0]
        cpu_per, mem_per = self.host_ratio(state[0])
        out = 0.0
        if cpu_free is not None and cpu_per > 0:
            out = max(out, total - cpu_free / cpu_per)
        if memory_free is not None and mem_per > 0:
            out = max(out, total - memory_free / mem_per)
        return out

    def shape_fragment(self, state: StateKey, s: Shape) -> float:
        """Free capacity of ``state`` that shape ``s`` cannot use (host not checked)."""
        return self._gpu_fragment(state, s.memory_units, s.cores)

    def fragmentation(
        self, state: StateKey, cpu_free: int | None = None, memory_free: int | None = None
    ) -> float:
        """The node's expected fragment over the workload (memoised)."""
        rc = len(self._cpus) if cpu_free is None else bisect.bisect_right(self._cpus, cpu_free)
        rm = (
            len(self._mems) if memory_free is None else bisect.bisect_right(self._mems, memory_free)
        )
        key = (state, rc, rm)
        v = self._frag.get(key)
        if v is None:
            total, usable = self.usable(state)
            weights = self.host_weights(cpu_free, memory_free)
            v = total - sum(u * w for u, w in zip(usable, weights, strict=True))
            self._frag.put(key, v, self.memo_limit)
        return v
