from __future__ import annotations

from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from gpu_share.observability.metrics import Metrics


def samples(m: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(m.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_all_metrics_are_prefixed_and_in_a_private_registry() -> None:
    m = Metrics()
    m.allocations_total.labels(resource="r", source="decision").inc()
    m.identity_ambiguous_total.inc()
    names = {f.name for f in text_string_to_metric_families(m.render().decode())}
    assert names and all(n.startswith("gpu_share_") for n in names)
    expected = {
        "gpu_share_allocations",
        "gpu_share_allocation_failures",
        "gpu_share_degraded_decisions",
        "gpu_share_identity_ambiguous",
        "gpu_share_device_units",
        "gpu_share_device_healthy",
        "gpu_share_allocate_seconds",
        "gpu_share_preferred_allocation_seconds",
        "gpu_share_registrations",
        "gpu_share_reregistrations",
        "gpu_share_ledger_writes",
        "gpu_share_kube_errors",
    }
    assert expected <= names
    assert REGISTRY.get_sample_value("gpu_share_identity_ambiguous_total") is None
    # Two instances do not clash (a second one in the global registry would raise).
    Metrics()


def test_counters_histograms_and_device_gauges() -> None:
    m = Metrics()
    m.allocation_failures_total.labels(resource="vendor.com/vcuda-core", reason="NoFit").inc(2)
    m.allocate_seconds.labels(resource="vendor.com/vcuda-memory").observe(0.0003)
    m.set_device_units("NPU-1", "vendor.com/vcuda-memory", used=3, free=13)
    m.set_device_healthy("NPU-1", False)
    s = samples(m)
    key = (("reason", "NoFit"), ("resource", "vendor.com/vcuda-core"))
    assert s[("gpu_share_allocation_failures_total", key)] == 2
    bucket = (("le", "0.0005"), ("resource", "vendor.com/vcuda-memory"))
    assert s[("gpu_share_allocate_seconds_bucket", bucket)] == 1
    bucket = (("le", "0.00025"), ("resource", "vendor.com/vcuda-memory"))
    assert s[("gpu_share_allocate_seconds_bucket", bucket)] == 0
    used = (("device", "NPU-1"), ("resource", "vendor.com/vcuda-memory"), ("state", "used"))
    free = (("device", "NPU-1"), ("resource", "vendor.com/vcuda-memory"), ("state", "free"))
    assert (s[("gpu_share_device_units", used)], s[("gpu_share_device_units", free)]) == (3, 13)
    assert s[("gpu_share_device_healthy", (("device", "NPU-1"),))] == 0


def test_forget_device_removes_its_series() -> None:
    m = Metrics()
    m.set_device_units("NPU-1", "mem", used=1, free=1)
    m.set_device_units("NPU-2", "mem", used=1, free=1)
    m.set_device_healthy("NPU-1", True)
    m.forget_device("NPU-1", ["mem", "core-never-set"])
    devices = {dict(k[1]).get("device") for k in samples(m) if k[0].startswith("gpu_share_device")}
    assert devices == {"NPU-2"}
