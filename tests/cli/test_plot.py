"""L1: ``kubectl gpu-share plot``: the PNG parses back (signature, IHDR, CRCs, IDAT) and its
pixels are the colours of the devices' used fractions; the per-device fragments are the
fgd measure split by device; the subcommand registers on a fresh parser and reads the
same two LISTs (the API answers faked at the LIST)."""

from __future__ import annotations

import argparse
import itertools
import random
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpu_share.cli import kubectl_plot as kplot
from gpu_share.cli import kubectl_plugin as kp
from gpu_share.cli.kubectl_fit import DEFAULT_WORKLOAD, parse_workload
from gpu_share.cli.kubectl_snapshot import Settings, Snapshot
from gpu_share.sharing.placement import DeviceSlot, NodeSlots, Shape, Workload
from tests.cli.objects import POOL, assignment, node_obj, pod_obj

# ---------------------------------------------------------------- helpers (the L3 test too)


@dataclass
class Png:
    width: int
    height: int
    rows: list[bytes]  # RGB, filters undone

    def pixel(self, x: int, y: int) -> tuple[int, int, int]:
        r = self.rows[y]
        return (r[3 * x], r[3 * x + 1], r[3 * x + 2])


def _unfilter(kind: int, line: bytearray, prev: bytes, bpp: int) -> None:
    for i in range(len(line)):
        a = line[i - bpp] if i >= bpp else 0
        b = prev[i]
        c = prev[i - bpp] if i >= bpp else 0
        if kind == 1:
            line[i] = (line[i] + a) & 0xFF
        elif kind == 2:
            line[i] = (line[i] + b) & 0xFF
        elif kind == 3:
            line[i] = (line[i] + (a + b) // 2) & 0xFF
        elif kind == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF


def read_png(data: bytes) -> Png:
    """A strict reader of 8-bit RGB PNGs, as the spec defines them."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "no PNG signature"
    pos, chunks = 8, []
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        (crc,) = struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF, f"bad CRC of {kind!r}"
        chunks.append((kind, body))
        pos += 12 + n
    assert chunks[0][0] == b"IHDR" and chunks[-1] == (b"IEND", b"")
    w, h, depth, colour, comp, filt, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, colour, comp, filt, interlace) == (8, 2, 0, 0, 0)
    raw = zlib.decompress(b"".join(b for k, b in chunks if k == b"IDAT"))
    stride = 3 * w
    assert len(raw) == h * (stride + 1)
    rows, prev = [], bytes(stride)
    for y in range(h):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        _unfilter(kind, line, prev, 3)
        rows.append(bytes(line))
        prev = rows[-1]
    return Png(w, h, rows)


def fleet_objects(n: int, *, tag: str = "x", seed: int = 17, namespace: str = "team-a"
                  ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A plausible fleet: every third node 8 x A100 80 GiB, the others 4 x T4 16 GiB;
    devices idle, shared or full, a few unhealthy; pods holding slices (their asks are
    the fgd workload) and two pending."""
    rnd = random.Random(seed)
    nodes, pods = [], []
    for i in range(n):
        big = i % 3 == 0
        total, count = (80, 8) if big else (16, 4)
        devices, shares = [], []
        for d in range(count):
            roll = rnd.random()
            if roll < 0.3:
                used = (0, 0)
            elif roll < 0.5:
                used = (total, 100)
            else:
                used = (rnd.randrange(1, total), 10 * rnd.randrange(1, 10))
            devices.append((total, used[0], used[1], rnd.random() > 0.01))
            if used[0] and d % 2 == 0:
                shares.append((d, used[0], used[1]))
        name = f"gpu-{tag}-{i:04d}"
        nodes.append(node_obj(name, devices, pool="a100" if big else "t4",
                              model="NVIDIA A100-SXM4-80GB" if big else "Tesla T4",
                              labels={"gpu-share-test/run": tag}))
        if i % 10 == 0:  # some pods, so the workload is the fleet's own mix
            for d, m, c in shares[:2]:
                pods.append(pod_obj(f"p-{i}-{d}", name, {"main": (m, c)}, namespace=namespace,
                                    annotation=assignment(name, {"main": [(d, m, c, False)]})))
    pods.append(pod_obj("waiting-1", None, {"main": (8, 50)}, namespace=namespace))
    pods.append(pod_obj("waiting-2", None, {"main": (4, 25)}, namespace=namespace))
    return nodes, pods


def cell_colours(png: Png, box: tuple[int, int, int, int]) -> tuple[Any, Any, Any]:
    """The colours at the middle of a cell's memory, cores and fragment bands."""
    x, y, w, _ = box
    return tuple(png.pixel(x + w // 2, y + kplot.BAND * i + kplot.BAND // 2) for i in range(3))


# ---------------------------------------------------------------- the measure


def test_device_fragments_split_the_fgd_measure() -> None:
    w = Workload([Shape(4, 25, 2.0), Shape(8, 50, 1.0), Shape(16, 100, 1.0),
                  Shape(16, 200, 0.5)])
    rnd = random.Random(3)
    for _ in range(300):
        devs = tuple(
            DeviceSlot(f"d{i}", i, 16, rnd.choice([0, 2, 4, 8, 12, 16]), 100,
                       rnd.choice([0, 10, 30, 50, 100]), rnd.random() > 0.1)
            for i in range(rnd.randint(1, 4)))
        slots = NodeSlots("n", devs)
        parts = kplot.device_fragments(w, slots)
        assert set(parts) == {d.uuid for d in devs if d.healthy}
        assert sum(parts.values()) == pytest.approx(w.fragmentation(slots.state), abs=1e-6)


def test_whole_device_shapes_leave_whole_free_devices_unfragmented() -> None:
    w = Workload([Shape(16, 100, 1.0)])
    slots = NodeSlots("n", (DeviceSlot("a", 0, 16, 16, 100, 100),
                            DeviceSlot("b", 1, 16, 8, 100, 50)))
    assert kplot.device_fragments(w, slots) == {"a": 0.0, "b": 500.0}


# ---------------------------------------------------------------- the picture


def _small() -> Snapshot:
    nodes = [node_obj("gpu-a", [(16, 4, 30, True), (16, 16, 100, True)], pool="t4"),
             node_obj("gpu-b", [(16, 0, 0, False), (16, 0, 0, True)], pool="t4"),
             node_obj("gpu-c", [(16, 8, 50, True)], pool="a100")]
    pods = [pod_obj("p1", "gpu-a", {"main": (4, 30)},
                    annotation=assignment("gpu-a", {"main": [(0, 4, 30, False)]}))]
    return Snapshot.from_lists(nodes, pods, Settings())


def test_png_parses_back_with_the_devices_colours() -> None:
    f = kplot.fleet(_small(), parse_workload(DEFAULT_WORKLOAD))
    assert [n.name for n in f.nodes] == ["gpu-c", "gpu-a", "gpu-b"]  # pool, then name
    assert f.unhealthy == 1 and f.memory_mib == (28 * 1024, 80 * 1024)
    pic = kplot.render(f)
    png = read_png(pic.png)
    assert (png.width, png.height) == (pic.width, pic.height)
    mem, cores, frag = cell_colours(png, pic.cells[("gpu-a", 0)])
    assert mem == kplot.used_colour(4 / 16) and cores == kplot.used_colour(0.3)
    assert frag == kplot.fragment_colour(0.0)  # 12 units / 70 cores fit every shape but 16:100
    mem, cores, frag = cell_colours(png, pic.cells[("gpu-a", 1)])
    assert mem == cores == kplot.used_colour(1.0) == (128, 0, 38)
    mem, cores, _ = cell_colours(png, pic.cells[("gpu-c", 0)])
    assert mem == kplot.used_colour(0.5) and cores == kplot.used_colour(0.5)
    x, y, w, h = pic.cells[("gpu-b", 0)]  # unhealthy: dark, red cross through the middle
    assert png.pixel(x, y + h - 1) == kplot.DEAD
    assert png.pixel(x + (w - h) // 2 + h // 2, y + h // 2) == kplot.RED
    for node in ("gpu-a", "gpu-b"):
        sx, sy, sw, _ = pic.strips[node]
        fgd = next(n.fgd for n in f.nodes if n.name == node)
        filled = round(sw * fgd)
        if filled:
            assert png.pixel(sx, sy) == kplot.fragment_colour(fgd)
        if filled < sw:
            assert png.pixel(sx + sw - 1, sy) == kplot.IDLE


def test_fragment_band_is_the_devices_share() -> None:
    # One shape, 8:50: a device with 4 units free cannot take it, so all it has free is
    # fragment; the idle device next to it can.
    nodes = [node_obj("n", [(16, 12, 50, True), (16, 0, 0, True)])]
    pods = [pod_obj("p", "n", {"main": (8, 50)})]  # the workload: this ask only
    f = kplot.fleet(Snapshot.from_lists(nodes, pods, Settings()), Workload([]))
    cells = {c.index: c for c in f.nodes[0].cells}
    assert cells[0].fragment == pytest.approx((4 / 16 + 50 / 100) / 2)
    assert cells[1].fragment == 0.0
    assert f.workload == "the asks of 1 containers"
    png = read_png(kplot.render(f).png)
    assert png.width >= 560


def test_a_thousand_nodes_wrap_into_columns() -> None:
    nodes, pods = fleet_objects(1200)
    f = kplot.fleet(Snapshot.from_lists(nodes, pods, Settings()), parse_workload(DEFAULT_WORKLOAD),
                    sort="fgd")
    assert [n.fgd for n in f.nodes] == sorted((n.fgd for n in f.nodes), reverse=True)
    pic = kplot.render(f)
    assert len(pic.cells) == sum(len(n.cells) for n in f.nodes)
    assert pic.width < 4000 and pic.height < 3000 and 1.0 < pic.width / pic.height < 3.0
    boxes = sorted(pic.cells.values())
    for a, b in itertools.pairwise(boxes):  # no cell overlaps the next
        assert a[0] + a[2] <= b[0] or a[1] + a[3] <= b[1] or b[1] + b[3] <= a[1]


def test_every_label_character_has_a_glyph() -> None:
    canvas = kplot.Canvas(400, 20, kplot.WHITE)
    canvas.text(0, 0, "abcdefghijklmnopqrstuvwxyz0123456789 -.,:/%()=+_<>?#*[]~|'", kplot.INK, 1)
    assert kplot.INK in {tuple(canvas.pixels[i:i + 3]) for i in range(0, 400 * 20 * 3, 3)}
    assert all(len(g) == 5 and all(c in "01234567" for c in g) for g in kplot._GLYPHS.values())


# ---------------------------------------------------------------- the command


def test_register_on_a_fresh_parser() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    kplot.register(sub, environ={"GPU_SHARE_DEFAULT_WORKLOAD": "2:10"})
    a = ap.parse_args(["plot", "--out", "x.png", "n1", "--pool", "t4", "--sort", "fgd"])
    assert (a.cmd, a.out, a.names, a.pool, a.sort, a.unhealthy, a.default_workload) == (
        "plot", "x.png", ["n1"], "t4", "fgd", False, "2:10")
    with pytest.raises(SystemExit):
        ap.parse_args(["plot"])  # --out is required


class Api:
    def close(self) -> None:
        pass


def _parsed(*argv: str) -> argparse.Namespace:
    """The plugin's own parser, with plot registered as the wiring does."""
    ap = kp.parser({})
    sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
    if "plot" not in sub.choices:
        kplot.register(sub, [kp._common({}, top=False)], environ={})
    return ap.parse_args(list(argv))


def test_plot_reads_the_same_two_lists(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = fleet_objects(30)
    calls: list[tuple[str, dict[str, Any]]] = []

    def paged(api: Any, op: str, path: str, *, page_size: int = 500, **sel: str) -> Any:
        calls.append((path, {"limit": page_size, **sel}))
        return (nodes if path.endswith("/nodes") else pods), "1"

    monkeypatch.setattr(kp, "rest_paged_list", paged)
    out = tmp_path / "cluster.png"
    a = _parsed("plot", "--out", str(out), "-l", "zone=x", "--pool", "t4", "--chunk-size", "50")
    assert kplot.cmd_plot(Api(), a, Settings()) == 0
    assert calls == [
        ("/api/v1/nodes", {"limit": 50, "labelSelector": f"zone=x,{POOL}=t4"}),
        ("/api/v1/pods", {"limit": 50, "fieldSelector": kp.LIVE}),
    ]
    png = read_png(out.read_bytes())
    assert capsys.readouterr().out == (
        f"wrote {out}: {png.width}x{png.height}, 30 nodes, 160 devices\n")



def test_cordoned_cells_are_framed_and_unhealthy_crossed() -> None:
    c = kplot.Canvas(40, 40, kplot.WHITE)
    kplot._draw_cell(c, 10, 10, kplot.Cell(0, 0.5, 0.5, 0.0, True, True))
    png = read_png(c.png())
    assert png.pixel(9, 9) == png.pixel(10 + kplot.CELL_W, 10 + kplot.CELL_H) == kplot.CORDON
    assert png.pixel(12, 12) == kplot.used_colour(0.5)


def test_a_cordoned_device_from_the_inventory_is_framed() -> None:
    import dataclasses

    from gpu_share.sharing.annotations import InventoryAnnotation, InventoryDevice, inventory_key

    if "cordoned" not in {f.name for f in dataclasses.fields(InventoryDevice)}:
        pytest.skip("the inventory has no cordons yet")
    devs = tuple(InventoryDevice(f"GPU-n-{i}", i, "Tesla T4", 16, 4 * i, 100, 10 * i, True, 0,
                                 **{"cordoned": i == 1}) for i in range(2))
    node = node_obj("n", None)
    node["metadata"]["annotations"] = {
        inventory_key("vendor.com"): InventoryAnnotation("n", 1024, devs).encode()}
    f = kplot.fleet(Snapshot.from_lists([node], [], Settings()), parse_workload(DEFAULT_WORKLOAD))
    assert [c.cordoned for c in f.nodes[0].cells] == [False, True] and f.cordoned == 1
    pic = kplot.render(f)
    png = read_png(pic.png)
    x, y, _, _ = pic.cells[("n", 1)]
    assert png.pixel(x - 1, y - 1) == kplot.CORDON
    x, y, _, _ = pic.cells[("n", 0)]
    assert png.pixel(x - 1, y - 1) == kplot.WHITE
