"""The paths of ``bench.scale``: one scheduler set-up each, one stream per rate.

``base`` kube-scheduler alone; ``extender`` kube-scheduler + the extender process (the
chart's scheduler configuration); ``dra`` kube-scheduler with DRA consumable capacity, the
pods as the admission webhook rewrites them; ``dra+extender`` the same DRA pods marked for
the extender (the webhook's ``--mark-for-extender``: the vcuda keys stay at "0" beside the
claim) and the dra path's kube-scheduler configured with the extender as the ``extender``
path configures it (the extender ranks the nodes, kube-scheduler's allocator picks the
devices, the extender's bind records them).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench import dra_stream as ds
from bench.replay import trace
from bench.scale import apiserver, cpu, model
from bench.scale import cluster as cl
from bench.scale import procs as pr

KEY = b"scale-bench-decision-key-0123456789"
IDLE_SETTLE_S = 10  # after the first path's scheduler started, before the idle sample
PATHS = ("base", "extender", "dra", "dra+extender")
DRA_PATHS = ("dra", "dra+extender")


class Run:
    def __init__(self, env: cl.Env, a: argparse.Namespace, nodes: Sequence[Any],
                 pods: Sequence[trace.TracePod]) -> None:
        self.env, self.a, self.pods, self.nodes = env, a, pods, nodes
        self.names = [f"p{i:05d}" for i in range(len(pods))]
        self.by_name = dict(zip(self.names, pods, strict=True))
        self.devices = {n.name: [d.uuid for d in n.devices] for n in nodes}
        self.capacity = ds.capacity_milli(nodes)
        self.offsets = {r: model.arrival_offsets(len(pods), r) for r in self.rates}
        self._idle: cpu.Usage | None = None

    @property
    def rates(self) -> list[float]:
        return [model.SEQUENTIAL if r == "seq" else float(r) for r in self.a.rates.split(",")]

    def label(self, path: str, rate: float) -> str:
        return f"{path} {'seq' if rate < 0 else 'max' if rate == 0 else f'{rate:g}/s'}"

    def namespace(self, short: str, rate: float) -> contextlib.AbstractContextManager[str]:
        return cl.namespace(self.env, f"gs-scale-{self.env.tag}-{short}-{int(rate) % 1000}")

    def go(self, ns: str, bodies: Sequence[dict[str, Any]], rate: float) -> tuple[cl.Stream, float]:
        s, wall = cl.stream(
            self.env, ns, bodies, self.offsets[rate], self.a.creators,
            self.a.stream_timeout, self.a.settle,
        )
        if s.errors:
            cl.log(f"  {len(s.errors)} creates failed, e.g. {s.errors[0]}")
        return s, wall

    def measured(
        self, label: str, ns: str, bodies: Sequence[dict[str, Any]], rate: float,
        ext: pr.ExtenderProc | None,
    ) -> tuple[model.PathFigures, cl.Stream]:
        """One stream; with ``ext``, the extender's figures over it too (and its signed
        decisions checked in bind order for the misplaced count). Every stream: the
        machine's CPU per bound pod by process, idle use taken out (``bench.scale.cpu``)."""
        pid = ext.proc.pid if ext is not None else None
        idle = self.idle()
        served0 = self.served()
        before = ext.stats() if ext is not None else None
        (s, wall), use = _timed_usage(pid, lambda: self.go(ns, bodies, rate))
        f = self.figures(label, s, wall, decisions=ext is not None)
        if ext is not None and before is not None:
            _extender_figures(f, before, ext.stats(), use.seconds.get("extender", 0.0))
        f.cpu_s_by_process = dict(use.seconds)
        f.cpu_ms_per_pod = use.per_pod_ms(f.bound, idle)
        f.busy_cores, f.idle_cores = use.busy_cores, idle.busy_cores if idle else float("nan")
        f.notes.append(use.note(f.bound, idle))
        served1 = self.served()
        if served0 is not None and served1 is not None:
            f.api_served = dict(served1 - served0)
            f.notes.append(apiserver.note(served0, served1, f.bound))
        return f, s

    def idle(self) -> cpu.Usage | None:
        """The machine with no stream, once a run, before its first stream (its
        scheduler's start settled first): what every stream's CPU per pod leaves out."""
        if self._idle is None and self.a.idle_sample > 0:
            time.sleep(IDLE_SETTLE_S)
            self._idle = _timed_usage(None, lambda: time.sleep(self.a.idle_sample))[1]
            cl.log(f"  idle: {self._idle.busy_cores:.2f} cores busy, "
                   + ", ".join(f"{k} {v:.2f}" for k, v in self._idle.cores().items()))
        return self._idle

    def served(self) -> Counter[str] | None:
        """The API server's requests so far (None, said, where /metrics can't be read)."""
        try:
            return apiserver.request_counts(self.env.kubeconfig)
        except (OSError, ValueError) as e:
            cl.log(f"  the API server's /metrics not read: {e}")
            return None

    def figures(self, label: str, s: cl.Stream, wall: float, decisions: bool) -> model.PathFigures:
        bound = sorted(s.bound.items(), key=lambda kv: kv[1][1])
        lat = [t - s.created[n] for n, (_, t) in bound if n in s.created]
        final = {n: p for n, p in s.pods.items() if (p.get("spec") or {}).get("nodeName")}
        milli = sum(self.by_name[n].gpu_request for n in final)
        placed = []
        for n, (node, _) in bound:
            p = final.get(n)
            if p is None:
                continue
            devs = decision_devices(p, node) if decisions else None
            placed.append(model.BoundPod(node, self.by_name[n], devs))
        return model.PathFigures(
            path=label,
            pods=len(self.pods),
            bound=len(final),
            unschedulable=len(self.pods) - len(final),
            wall_s=wall,
            latencies_s=lat,
            alloc_pct=model.allocation_pct(milli, self.capacity),
            misplaced=model.misplaced(placed, self.devices),
        )


def _timed_usage(pid: int | None, work: Any) -> tuple[Any, cpu.Usage]:
    s0, t0 = cpu.sample(pid), time.monotonic()
    result = work()
    return result, cpu.usage(s0, cpu.sample(pid), time.monotonic() - t0)


def decision_devices(pod: dict[str, Any], node: str) -> tuple[str, ...]:
    """The devices of the extender's signed decision on ``pod`` (bound to ``node``); ()
    where it has none or it does not verify."""
    from gpu_share.sharing.decision import DecisionError, decision_key, verify_binding

    notes = (pod.get("metadata") or {}).get("annotations") or {}
    text = notes.get(decision_key("vendor.com"))
    if not text:
        return ()  # bound without a decision: counts as misplaced
    try:
        d = verify_binding(text, KEY, str(pod["metadata"]["uid"]), node)
    except DecisionError:
        return ()
    return tuple(x for c in d.containers.values() for x in c.devices)


def _extender_figures(f: model.PathFigures, before: dict[str, Any], after: dict[str, Any],
                      cpu_s: float) -> None:
    verbs = (("filter", "filter_ms"), ("prioritize", "prioritize_ms"), ("bind", "bind_ms"))
    for verb, attr in verbs:
        n0 = len(before["durations_ms"][verb])
        setattr(f, attr, list(after["durations_ms"][verb][n0:]))
    f.filter_nodes = list(after["filter_names"][len(before["filter_names"]):])
    f.api_requests = sum(after["api"].values()) - sum(before["api"].values())
    f.rss_mib = float(after["rss_mib"])
    marks = after.get("marks") or {}
    f.view_mib = float(marks.get("rss_synced_mib", 0)) - float(marks.get("rss_before_sync_mib", 0))
    f.cpu_s = cpu_s
    kinds = {k: v - before["api"].get(k, 0) for k, v in after["api"].items()}
    f.notes.append("api by kind: " + json.dumps({k: v for k, v in kinds.items() if v}))


@contextlib.contextmanager
def _extender(
    r: Run, workload_file: Path | None, dra_driver: str = ""
) -> Iterator[pr.ExtenderProc]:
    """The extender process on a free port (``--extender-src``'s tree if given)."""
    src = Path(r.a.extender_src) if r.a.extender_src else None
    with pr.extender(r.env, pr.free_port(), KEY, workload_file, src, dra_driver) as ext:
        yield ext


# ---------------------------------------------------------------- base and extender


def run_base(r: Run) -> list[model.PathFigures]:
    env, out = r.env, []
    name = f"gs-scale-base-{env.tag}"
    cfg = pr.scheduler_config(env, name, None, r.a.scheduler_qps)
    with pr.kube_scheduler(env, name, cfg, gogc=r.a.scheduler_gogc):
        for rate in r.rates:
            with r.namespace("base", rate) as ns:
                bodies = [model.vcuda_pod(n, p, name, env.tag) for n, p in r.by_name.items()]
                out.append(r.measured(r.label("base", rate), ns, bodies, rate, None)[0])
                _progress(out[-1])
    return out


def run_extender(r: Run, workload_file: Path | None) -> list[model.PathFigures]:
    env, out = r.env, []
    name = f"gs-scale-ext-{env.tag}"
    with _extender(r, workload_file) as ext:
        cfg = pr.scheduler_config(env, name, ext.port, r.a.scheduler_qps, r.a.nodes_to_score)
        with pr.kube_scheduler(env, name, cfg, gogc=r.a.scheduler_gogc):
            for rate in r.rates:
                with r.namespace("ext", rate) as ns:
                    bodies = [model.vcuda_pod(n, p, name, env.tag) for n, p in r.by_name.items()]
                    out.append(r.measured(r.label("extender", rate), ns, bodies, rate, ext)[0])
                    _progress(out[-1])
                time.sleep(2)  # the view sees the deletions before the next stream
    return out


# ---------------------------------------------------------------- DRA


def run_dra(
    r: Run, scheduler: Path | None = None, workload_file: Path | None = None,
    with_extender: bool = False,
) -> list[model.PathFigures]:
    """The ``dra`` path, or with ``with_extender`` the ``dra+extender`` path: the same
    kube-scheduler (``--dra-scheduler``, ``--dra-nodes-to-score``, the gate), the pods
    marked for the extender and the extender in the scheduler's config."""
    env, out = r.env, []
    path, short = ("dra+extender", "drx") if with_extender else ("dra", "dra")
    version = pr.binary_version(scheduler or env.k8s_bin / "kube-scheduler")
    name = f"gs-scale-{short}-{env.tag}"
    settings = ds.translation_settings(f"gs-scale-{short}-{env.tag}")
    if with_extender:
        settings = replace(settings, mark_for_extender=True)
    with contextlib.ExitStack() as stack:
        stack.enter_context(_device_class(env, settings.device_class))
        ext = stack.enter_context(_extender(r, workload_file, ds.DRIVER)) if with_extender else None
        cfg = pr.scheduler_config(env, name, ext.port if ext else None, r.a.scheduler_qps)
        cfg["percentageOfNodesToScore"] = r.a.dra_nodes_to_score  # 0: adaptive
        stack.enter_context(pr.kube_scheduler(
            env, name, cfg, gates="DRAConsumableCapacity=true", binary=scheduler,
            gogc=r.a.scheduler_gogc,
        ))
        for rate in r.rates:
            with r.namespace(short, rate) as ns:
                bodies = _dra_bodies(r, name, ns, settings)
                f, s = r.measured(r.label(path, rate), ns, bodies, rate, ext)
                _claim_figures(r, f, s, ns, decisions=with_extender)
                f.notes.append(f"kube-scheduler: {version}")
                out.append(f)
                _progress(f)
            if ext is not None:
                time.sleep(2)  # the view sees the deletions before the next stream
    return out


@contextlib.contextmanager
def _device_class(env: cl.Env, klass: str) -> Iterator[None]:
    env.custom.create_cluster_custom_object(
        "resource.k8s.io", "v1", "deviceclasses", ds.device_class(klass)
    )
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            env.custom.delete_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", klass)


def _dra_bodies(r: Run, scheduler: str, ns: str, settings: Any) -> list[dict[str, Any]]:
    """The pods as the webhook leaves them; their claim templates are created here."""
    bodies, templates = [], {}
    for n, p in r.by_name.items():
        body, t = ds.dra_pod(model.vcuda_pod(n, p, scheduler, r.env.tag), ns, settings)
        bodies.append(body)
        templates.update({tb["metadata"]["name"]: tb for tb in t.templates})
    for tb in templates.values():
        r.env.custom.create_namespaced_custom_object(
            "resource.k8s.io", "v1", ns, "resourceclaimtemplates", tb
        )
    return bodies


def _claim_figures(
    r: Run, f: model.PathFigures, s: cl.Stream, ns: str, decisions: bool
) -> None:
    """DRA's own device accounting (the claims' consumed capacity) replaces the
    misplaced count; the unbound pods that would still fit; with the extender, how many
    bound pods carry its signed decision."""
    claims = r.env.custom.list_namespaced_custom_object(
        "resource.k8s.io", "v1", ns, "resourceclaims"
    )["items"]
    f.misplaced = ds.claim_use(claims).devices_over
    f.notes.append("misplaced = devices over capacity in the claims")
    f.notes.append(claim_rate(claims))
    bound_on = {
        n: str(p["spec"]["nodeName"]) for n, p in s.pods.items()
        if (p.get("spec") or {}).get("nodeName")
    }
    fit = model.unbound_that_fit(r.nodes, r.by_name, bound_on, model.device_use(claims))
    f.unbound_fit = len(fit)
    f.notes.append(
        f"{len(fit)} unbound pods would fit on a node at the end"
        + (f", e.g. {', '.join(fit[:5])}" if fit else "")
        + f"; {len(s.unschedulable)} were refused as unschedulable"
    )
    if decisions:
        signed = sum(1 for n, node in bound_on.items() if decision_devices(s.pods[n], node))
        f.notes.append(f"{signed} of {len(bound_on)} bound pods carry the extender's decision")


def claim_rate(claims: Sequence[dict[str, Any]]) -> str:
    """How fast kube-controller-manager made the claims from their templates (two writes
    per pod, the claim and the pod's status, on a client of 20 QPS by default)."""
    stamps = sorted(
        time.mktime(time.strptime(c["metadata"]["creationTimestamp"], "%Y-%m-%dT%H:%M:%SZ"))
        for c in claims
    )
    if len(stamps) < 2 or stamps[-1] <= stamps[0]:
        return f"{len(stamps)} claims made"
    return (f"{len(stamps)} claims made by kube-controller-manager in "
            f"{stamps[-1] - stamps[0]:.0f} s: {(len(stamps) - 1) / (stamps[-1] - stamps[0]):.1f}/s")


def _progress(f: model.PathFigures) -> None:
    cl.log(f"  {f.path}: {f.bound}/{f.pods} bound, {f.pods_per_s:.1f} pods/s, "
           f"allocation {f.alloc_pct:.2f} %, misplaced {f.misplaced}, {f.wall_s:.0f} s")
