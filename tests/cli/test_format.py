"""L1: kubectl gpu-share's tables, bars, sizes, ages and documents."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
import yaml

from gpu_share.cli import kubectl_format as fmt
from gpu_share.cli.kubectl_fit import FitResult, FitRow
from gpu_share.cli.kubectl_view import DeviceRow, NodeRow, SliceRow


@pytest.mark.parametrize(
    ("used", "total", "want"),
    [
        (0, 16, "[----------]"),
        (16, 16, "[##########]"),
        (8, 16, "[#####-----]"),
        (1, 100, "[#---------]"),  # any use shows
        (99, 100, "[#########-]"),  # not full never looks full
        (120, 100, "[##########]"),  # clamped
        (3, 0, "[??????????]"),
    ],
)
def test_bar(used: int, total: int, want: str) -> None:
    assert fmt.bar(used, total) == want


def test_sizes() -> None:
    assert fmt.memory_pair(6, 16, 1024) == "6/16Gi"
    assert fmt.memory_pair(3, 64, 256) == "768Mi/16Gi"
    assert fmt.block((12, 40), 1024) == "12Gi/40%"
    assert fmt.block((3, 5), 512) == "1536Mi/5%"
    assert fmt.block(None, 1024) == "<none>"


@pytest.mark.parametrize(
    ("seconds", "want"),
    [(5, "5s"), (119, "119s"), (300, "5m"), (312, "5m12s"), (95 * 60, "95m"),
     (200 * 60, "3h20m"), (30 * 3600, "30h"), (4 * 86400 + 6 * 3600, "4d6h"),
     (120 * 86400, "120d"), (800 * 86400, "2y")],
)
def test_age(seconds: int, want: str) -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    created = datetime.fromtimestamp(now.timestamp() - seconds, UTC)
    assert fmt.age(created.strftime("%Y-%m-%dT%H:%M:%SZ"), now) == want
    assert fmt.age("garbage", now) == "<unknown>"


def _node() -> NodeRow:
    d0 = DeviceRow("gpu-a", 0, "GPU-a-0", "Tesla T4", True, 0, 1024, 16, 10, 100, 60,
                   ("ns/p1", "ns/p2"))
    d1 = DeviceRow("gpu-a", 1, "GPU-a-1", "Tesla T4", False, None, 1024, 16, 0, 100, 0, ())
    return NodeRow("gpu-a", "t4", 1024, (d0, d1), ("ns/p1", "ns/p2"), (6, 40))


def test_nodes_table_and_wide() -> None:
    text = fmt.nodes_table([_node()])
    lines = text.splitlines()
    assert lines[0].split() == ["NODE", "GPU", "MODEL", "MEMORY", "CORES", "HEALTH", "PODS",
                                "LARGEST", "FREE", "USAGE"]
    assert lines[1].split() == ["gpu-a", "0", "Tesla", "T4", "10/16Gi", "60/100", "Healthy",
                                "2", "6Gi/40%", "mem[######----]", "core[######----]"]
    assert "Unhealthy" in lines[2] and "mem[----------]" in lines[2]
    # Columns line up: every row starts its MEMORY cell at the header's column.
    col = lines[0].index("MEMORY")
    assert all(line[col:].startswith(("10/16Gi", "0/16Gi", "MEMORY")) for line in lines)
    wide = fmt.nodes_table([_node()], wide=True).splitlines()
    assert wide[0].split()[-5:] == ["POOL", "UUID", "NUMA", "POD", "NAMES"]
    assert wide[1].split()[-4:] == ["t4", "GPU-a-0", "0", "ns/p1,ns/p2"]
    assert wide[2].split()[-4:] == ["t4", "GPU-a-1", "<none>", "<none>"]


def test_nodes_json_and_yaml_agree() -> None:
    doc = fmt.nodes_doc([_node()])
    as_json = json.loads(fmt.document(doc, "json"))
    as_yaml = yaml.safe_load(fmt.document(doc, "yaml"))
    assert as_json == as_yaml == doc
    item = doc["items"][0]
    assert item["largestFree"] == {"memoryUnits": 6, "cores": 40}
    assert item["devices"][0]["memoryUnits"] == {"total": 16, "used": 10, "free": 6}
    assert item["devices"][0]["memoryMiB"] == {"total": 16384, "used": 10240}
    assert item["devices"][1]["healthy"] is False


def _slices() -> list[SliceRow]:
    return [
        SliceRow("a", "p1", "main", "gpu-a", "GPU-a-0", 0, 6, 30, 1024, False, "node-agent",
                 True, "2026-01-01T00:00:00Z"),
        SliceRow("a", "p2", "main", "", "", None, 8, 100, None, True, "pending", False, ""),
    ]


def test_pods_table() -> None:
    now = datetime(2026, 1, 1, 0, 5, tzinfo=UTC)
    lines = fmt.pods_table(_slices(), now, all_namespaces=False).splitlines()
    assert lines[0].split() == ["POD", "CONTAINER", "NODE", "GPU", "MEMORY", "CORES", "MODE",
                                "SOURCE", "AGE"]
    assert lines[1].split() == ["p1", "main", "gpu-a", "0", "6Gi", "30", "shared",
                                "node-agent", "5m"]
    assert lines[2].split() == ["p2", "main", "<none>", "<none>", "8u", "100", "exclusive",
                                "pending", "<unknown>"]
    wide = fmt.pods_table(_slices(), now, all_namespaces=True, wide=True).splitlines()
    assert wide[0].split()[0] == "NAMESPACE" and wide[0].split()[-2:] == ["UUID", "SIGNED"]
    assert wide[1].split()[-2:] == ["GPU-a-0", "yes"]
    doc = fmt.pods_doc(_slices())
    assert doc["items"][0]["memoryMiB"] == 6144 and doc["items"][1]["node"] is None


def test_fit_text_groups_nodes_without_inventory() -> None:
    no_inv = "gpu-share: node has no gpu-share inventory (agent not running?)"
    res = FitResult(
        (FitRow("gpu-b", 10, (("main", 1, "GPU-b-1"),), (16, 100)),
         FitRow("gpu-a", 9, (("main", 0, "GPU-a-0"),), (8, 50))),
        {"gpu-c": "gpu-share: no healthy device", **{f"cpu-{i}": no_inv for i in range(7)}},
        "",
    )
    text = fmt.fit_text(res, {"gpu-a": 1024, "gpu-b": 1024})
    assert text.splitlines()[0] == "Fits on 2 node(s), best first:"
    assert text.splitlines()[2].split() == ["gpu-b", "10", "main:1", "16Gi/100%"]
    assert "gpu-c   gpu-share: no healthy device" in text
    assert "7 node(s) without a gpu-share inventory: cpu-0, cpu-1, cpu-2, cpu-3, cpu-4, ..." \
        in text
    wide = fmt.fit_text(res, {}, wide=True)
    assert "cpu-6   " + no_inv in wide and "without a gpu-share inventory:" not in wide
    none = fmt.fit_text(FitResult((), {"gpu-c": "x"}, ""), {})
    assert none.startswith("Fits on no node.")
    assert fmt.fit_text(FitResult((), {}, "bad"), {}) == "the pod is not valid: bad\n"
    doc = fmt.fit_doc(res, {"memoryUnits": 6})
    assert doc["fits"][0] == {"node": "gpu-b", "score": 10,
                              "devices": [{"container": "main", "index": 1, "id": "GPU-b-1"}]}
    assert doc["failed"]["gpu-c"] == "gpu-share: no healthy device"
