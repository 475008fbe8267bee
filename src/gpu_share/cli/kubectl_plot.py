"""``kubectl gpu-share plot --out cluster.png``: a picture of the fleet.

One cell per device, nodes in rows (wrapped into columns, so 1,000+ nodes fit one
picture), each cell in three bands: memory used, cores used, and the device's free
capacity that the fgd policy counts as fragment (no shape of the target workload can use
it). A strip right of each node shows the node's fgd value (what ``fgd`` minimises:
fragmentation plus host stranding) as a share of the node's free GPU capacity. Unhealthy
devices are dark with a red cross; cordoned ones have a black frame.

The data is what ``nodes`` and ``fit`` read: one LIST of nodes and one of live pods
(pending pods too: their asks are part of the workload the extender's fgd policy uses),
through ``kubectl_snapshot`` and ``kubectl_view``. The PNG is written here (zlib +
struct, a 3x5 bitmap font): no imaging library to install for a picture of flat
rectangles.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import re
import struct
import sys
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_share.cli.kubectl_fit import DEFAULT_WORKLOAD, SnapshotView, parse_workload
from gpu_share.cli.kubectl_snapshot import Settings, Snapshot
from gpu_share.cli.kubectl_view import NodeRow, node_problems, node_rows
from gpu_share.sharing.placement import MILLI, NodeSlots, Workload, make_policy
from gpu_share.sharing.placement.fragmentation import (
    amount,
    fits_shared,
    is_whole_free,
    whole_count,
)

RGB = tuple[int, int, int]
Box = tuple[int, int, int, int]  # x, y, width, height

# ---------------------------------------------------------------- the measure


def device_fragments(workload: Workload, slots: NodeSlots) -> dict[str, float]:
    """Each healthy device's part of the node's fgd fragmentation (GPU-milli): for every
    GPU shape of the workload, weighted by popularity, the device's free amount when that
    shape cannot use it (the shape fits no device set of the node, or this device is too
    small / not wholly free for it). The parts sum to ``workload.fragmentation(state)``."""
    healthy = [d for d in slots.devices if d.healthy]
    out = dict.fromkeys((d.uuid for d in healthy), 0.0)
    if not healthy:
        return out
    weights: dict[tuple[int, int], float] = {}
    for s in workload.shapes:
        weights[(s.memory_units, s.cores)] = weights.get((s.memory_units, s.cores), 0.0) + s.weight
    cores_total = min(d.key for d in healthy)[3]  # the state's first device, as fgd reads it
    for (m, c), w in weights.items():
        k = whole_count(m, c, cores_total)
        if k:
            useless = [not is_whole_free(d.key) for d in healthy]
            fits = useless.count(False) >= k
        else:
            useless = [not fits_shared(d.key, m, c) for d in healthy]
            fits = not all(useless)
        for d, bad in zip(healthy, useless, strict=True):
            if bad or not fits:
                out[d.uuid] += w * amount(d.key)
    return out


@dataclass(frozen=True)
class Cell:
    index: int
    memory_used: float  # fractions 0..1
    cores_used: float
    fragment: float  # share of the device's capacity fgd counts as fragment
    healthy: bool
    cordoned: bool


@dataclass(frozen=True)
class NodeCells:
    name: str
    pool: str
    cells: tuple[Cell, ...]
    fgd: float  # the node's fgd value over its free GPU capacity (0..1, clamped)


@dataclass(frozen=True)
class Fleet:
    nodes: tuple[NodeCells, ...]
    memory_mib: tuple[int, int]  # used, total
    cores: tuple[int, int]
    fgd: tuple[float, float]  # fgd value, free capacity (GPU-milli, whole fleet)
    unhealthy: int
    cordoned: int
    workload: str  # where the target workload comes from


def _natural(name: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def _frac(part: float, whole: float) -> float:
    return min(1.0, max(0.0, part / whole)) if whole > 0 else 0.0


def _cordoned(snap: Snapshot, node: str) -> set[str]:
    """Cordoned device ids, once the inventory reports them (``cordoned`` per device)."""
    inv = snap.nodes[node].inventory
    return {d.id for d in (inv.devices if inv else ()) if d.cordoned}


def fleet(snap: Snapshot, default_workload: Workload, *, rows: Sequence[NodeRow] | None = None,
          sort: str = "name") -> Fleet:
    """What the picture shows, from a snapshot: ``rows`` are ``node_rows(snap)`` (or a
    filtered subset); the workload is the one the extender's fgd policy would use."""
    view = SnapshotView(snap, default_workload)
    workload = view.workload()
    policy = make_policy("fgd", workload)
    rows = node_rows(snap) if rows is None else rows
    nodes, mem, cores, fgd_sum, free_sum = [], [0, 0], [0, 0], 0.0, 0.0
    for r in rows:
        slots = view.node(r.name)
        if slots is None:
            continue
        w = workload.for_model(slots.model)
        parts = device_fragments(w, slots)
        cordoned = _cordoned(snap, r.name)
        state = slots.state
        value = policy.potential(state, slots.cpu_free, slots.host_memory_free, slots.model)
        free = sum(amount(k) for k in state)
        fgd_sum += value
        free_sum += free
        cells = []
        for d in r.devices:
            mem[0] += d.memory_used * d.unit_mib
            mem[1] += d.memory_total * d.unit_mib
            cores[0] += d.cores_used
            cores[1] += d.cores_total
            cells.append(Cell(d.index, _frac(d.memory_used, d.memory_total),
                              _frac(d.cores_used, d.cores_total),
                              _frac(parts.get(d.id, 0.0), MILLI), d.healthy,
                              d.id in cordoned))
        nodes.append(NodeCells(r.name, r.pool, tuple(cells), _frac(value, free)))
    keys = {
        "name": lambda n: (n.pool, _natural(n.name)),
        "used": lambda n: (-sum(c.memory_used + c.cores_used for c in n.cells)
                           / max(1, len(n.cells)), _natural(n.name)),
        "fgd": lambda n: (-n.fgd, _natural(n.name)),
    }
    nodes.sort(key=keys[sort])
    asks = sum(1 for p in snap.pods for c in p.ask.containers if not c.request.empty)
    source = (f"the asks of {asks} containers" if workload is not default_workload
              else "the default workload")
    return Fleet(tuple(nodes), (mem[0], mem[1]), (cores[0], cores[1]), (fgd_sum, free_sum),
                 sum(not c.healthy for n in nodes for c in n.cells),
                 sum(c.cordoned for n in nodes for c in n.cells), source)


# ---------------------------------------------------------------- a 3x5 font

# Each glyph: 5 rows, one octal digit per row (4 = left pixel, 2 = middle, 1 = right).
_GLYPHS = {
    "0": "75557", "1": "26227", "2": "71747", "3": "71317", "4": "55711", "5": "74717",
    "6": "74757", "7": "71222", "8": "75757", "9": "75717",
    "A": "25755", "B": "65656", "C": "34443", "D": "65556", "E": "74647", "F": "74644",
    "G": "34553", "H": "55755", "I": "72227", "J": "11152", "K": "55655", "L": "44447",
    "M": "57755", "N": "65555", "O": "25552", "P": "65644", "Q": "25563", "R": "65655",
    "S": "34216", "T": "72222", "U": "55557", "V": "55552", "W": "55775", "X": "55255",
    "Y": "55222", "Z": "71247",
    " ": "00000", "-": "00700", ".": "00002", ",": "00022", ":": "02020", "/": "11244",
    "%": "41241", "(": "24442", ")": "21112", "=": "07070", "+": "02720", "_": "00007",
    "<": "12421", ">": "42124", "?": "71202", "#": "57575", "*": "05250", "[": "64446",
    "]": "31113", "~": "03600", "|": "22222", "'": "22000",
}
ADVANCE = 4  # glyph width 3 + 1 space, times the scale


def text_width(text: str, scale: int) -> int:
    return len(text) * ADVANCE * scale


# ---------------------------------------------------------------- a canvas and PNG


class Canvas:
    """RGB pixels in one bytearray; rectangles and text are all the picture needs."""

    def __init__(self, width: int, height: int, background: RGB) -> None:
        self.width, self.height = width, height
        self.pixels = bytearray(bytes(background) * (width * height))

    def rect(self, x: int, y: int, w: int, h: int, colour: RGB) -> None:
        x0, y0 = max(0, x), max(0, y)
        x1, y1 = min(self.width, x + w), min(self.height, y + h)
        if x1 <= x0 or y1 <= y0:
            return
        run = bytes(colour) * (x1 - x0)
        for yy in range(y0, y1):
            start = (yy * self.width + x0) * 3
            self.pixels[start:start + len(run)] = run

    def frame(self, x: int, y: int, w: int, h: int, colour: RGB) -> None:
        self.rect(x, y, w, 1, colour)
        self.rect(x, y + h - 1, w, 1, colour)
        self.rect(x, y, 1, h, colour)
        self.rect(x + w - 1, y, 1, h, colour)

    def cross(self, x: int, y: int, size: int, colour: RGB) -> None:
        for i in range(size):
            self.rect(x + i, y + i, 1, 1, colour)
            self.rect(x + size - 1 - i, y + i, 1, 1, colour)

    def text(self, x: int, y: int, text: str, colour: RGB, scale: int = 2) -> None:
        for n, ch in enumerate(text.upper()):
            glyph = _GLYPHS.get(ch, _GLYPHS["?"])
            gx = x + n * ADVANCE * scale
            for row, digit in enumerate(glyph):
                bits = int(digit, 8)
                for col in range(3):
                    if bits & (4 >> col):
                        self.rect(gx + col * scale, y + row * scale, scale, scale, colour)

    def png(self) -> bytes:
        stride = self.width * 3
        raw = b"".join(b"\x00" + self.pixels[y * stride:(y + 1) * stride]
                       for y in range(self.height))  # filter 0 (none) on every row

        def chunk(kind: bytes, data: bytes) -> bytes:
            return (struct.pack(">I", len(data)) + kind + data
                    + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

        ihdr = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)  # 8-bit RGB
        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
                + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


# ---------------------------------------------------------------- colours

WHITE: RGB = (255, 255, 255)
INK: RGB = (33, 37, 41)
GREY: RGB = (108, 117, 125)
IDLE: RGB = (222, 228, 236)  # nothing used / no fragment
DEAD: RGB = (64, 64, 64)
RED: RGB = (220, 30, 30)
CORDON: RGB = (0, 0, 0)
_USED = ((0.0, IDLE), (0.35, (254, 217, 118)), (0.7, (240, 59, 32)), (1.0, (128, 0, 38)))
_FRAG = ((0.0, IDLE), (0.5, (158, 154, 200)), (1.0, (63, 0, 125)))


def _ramp(stops: Sequence[tuple[float, RGB]], t: float) -> RGB:
    t = min(1.0, max(0.0, t))
    for (t0, c0), (t1, c1) in itertools.pairwise(stops):
        if t <= t1:
            f = (t - t0) / (t1 - t0)
            return (round(c0[0] + (c1[0] - c0[0]) * f), round(c0[1] + (c1[1] - c0[1]) * f),
                    round(c0[2] + (c1[2] - c0[2]) * f))
    return stops[-1][1]


def used_colour(fraction: float) -> RGB:
    return _ramp(_USED, fraction)


def fragment_colour(fraction: float) -> RGB:
    return _ramp(_FRAG, fraction)


# ---------------------------------------------------------------- layout and drawing

MARGIN, S = 12, 2  # page margin; text scale (a glyph is 6x10 pixels)
CELL_W, BAND = 14, 5  # a device cell: three bands of BAND pixels
CELL_H = 3 * BAND
PITCH_X, PITCH_Y = CELL_W + 2, CELL_H + 3
STRIP_W = 40
LABEL_CHARS = 18


@dataclass(frozen=True)
class Picture:
    png: bytes
    width: int
    height: int
    cells: dict[tuple[str, int], Box]  # (node, device index) -> its cell
    strips: dict[str, Box]  # node -> its fgd strip (the filled part starts at x)


def _label(name: str) -> str:
    if len(name) <= LABEL_CHARS:
        return name
    half = (LABEL_CHARS - 1) // 2
    return name[:half] + "~" + name[-(LABEL_CHARS - 1 - half):]


def _gib(mib: int) -> str:
    return f"{mib / 1024:.0f}"


def _header(f: Fleet) -> list[str]:
    devices = sum(len(n.cells) for n in f.nodes)
    (mu, mt), (cu, ct), (fv, free) = f.memory_mib, f.cores, f.fgd
    return [
        f"gpu-share fleet: {len(f.nodes)} nodes, {devices} devices"
        f" ({f.unhealthy} unhealthy, {f.cordoned} cordoned)",
        f"memory {_gib(mu)}/{_gib(mt)} GiB used ({100 * mu / max(1, mt):.0f}%), cores"
        f" {cu / 100:.1f}/{ct / 100:.0f} GPUs used ({100 * cu / max(1, ct):.0f}%)",
        f"fgd: {fv / MILLI:.1f} GPUs of fragment, {100 * fv / max(1.0, free):.0f}% of the"
        f" {free / MILLI:.1f} GPUs free (workload: {f.workload})",
    ]


_LEGEND = [
    "each cell is one device: top = memory used, middle = cores used,",
    "bottom = its free part fgd counts as fragment (no workload shape can use it)",
    "strip right of a node: its fgd value (fragment + host stranding) / its free GPUs",
]


def _ramp_bar(c: Canvas, x: int, y: int, colour: Any, title: str) -> int:
    """A 0..100% colour bar with its title; returns the x after it."""
    c.text(x, y, title, INK, S)
    y += 14
    for i in range(100):
        c.rect(x + i, y, 1, 10, colour(i / 99))
    c.text(x, y + 13, "0%", GREY, S)
    c.text(x + 100 - text_width("100%", S), y + 13, "100%", GREY, S)
    return x + max(100, text_width(title, S)) + 24


def _draw_cell(c: Canvas, x: int, y: int, cell: Cell) -> None:
    if cell.healthy:
        c.rect(x, y, CELL_W, BAND, used_colour(cell.memory_used))
        c.rect(x, y + BAND, CELL_W, BAND, used_colour(cell.cores_used))
        c.rect(x, y + 2 * BAND, CELL_W, BAND, fragment_colour(cell.fragment))
    else:
        c.rect(x, y, CELL_W, CELL_H, DEAD)
        c.cross(x + (CELL_W - CELL_H) // 2, y, CELL_H, RED)
    if cell.cordoned:
        c.frame(x - 1, y - 1, CELL_W + 2, CELL_H + 2, CORDON)


def _legend(c: Canvas, x: int, y: int) -> None:
    x = _ramp_bar(c, x, y, used_colour, "used")
    x = _ramp_bar(c, x, y, fragment_colour, "fgd fragment")
    samples = [("healthy", Cell(0, 0.6, 0.3, 0.2, True, False)),
               ("unhealthy", Cell(0, 0, 0, 0, False, False)),
               ("cordoned", Cell(0, 0.2, 0.5, 0.0, True, True))]
    for name, cell in samples:
        _draw_cell(c, x, y + 2, cell)
        c.text(x + CELL_W + 6, y + 5, name, INK, S)
        x += CELL_W + 6 + text_width(name, S) + 20


def render(f: Fleet, *, aspect: float = 1.6) -> Picture:
    """Draw the fleet: header, legend, then node rows wrapped into columns so the body
    is about ``aspect`` times as wide as high."""
    devs = max((len(n.cells) for n in f.nodes), default=1)
    label_w = text_width("x" * min(LABEL_CHARS, max((len(n.name) for n in f.nodes),
                                                   default=4)), S)
    col_w = label_w + 8 + devs * PITCH_X + 6 + STRIP_W + 24
    n = len(f.nodes)
    cols = max(1, min(n, round(math.sqrt(aspect * n * PITCH_Y / col_w)))) if n else 1
    per_col = math.ceil(n / cols) if n else 0
    header, line = _header(f), 13 * S // 2 + 6
    top = MARGIN + line * (len(header) + len(_LEGEND)) + 6 + 44 + 10
    width = max(2 * MARGIN + cols * col_w - 24,
                2 * MARGIN + max(text_width(t, S) for t in header + _LEGEND), 560)
    height = top + per_col * PITCH_Y + MARGIN
    c = Canvas(width, height, WHITE)
    y = MARGIN
    for i, t in enumerate(header):
        c.text(MARGIN, y, t, INK if i == 0 else GREY, S)
        y += line
    for t in _LEGEND:
        c.text(MARGIN, y, t, GREY, S)
        y += line
    _legend(c, MARGIN, y + 6)
    cells: dict[tuple[str, int], Box] = {}
    strips: dict[str, Box] = {}
    for i, node in enumerate(f.nodes):
        x0 = MARGIN + (i // per_col) * col_w
        y0 = top + (i % per_col) * PITCH_Y
        c.text(x0, y0 + (CELL_H - 5 * S) // 2, _label(node.name), INK, S)
        x = x0 + label_w + 8
        for k, cell in enumerate(node.cells):
            _draw_cell(c, x + k * PITCH_X, y0, cell)
            cells[(node.name, cell.index)] = (x + k * PITCH_X, y0, CELL_W, CELL_H)
        sx = x + devs * PITCH_X + 6
        c.rect(sx, y0 + 2, STRIP_W, CELL_H - 4, IDLE)
        c.rect(sx, y0 + 2, round(STRIP_W * node.fgd), CELL_H - 4, fragment_colour(node.fgd))
        strips[node.name] = (sx, y0 + 2, STRIP_W, CELL_H - 4)
    return Picture(c.png(), width, height, cells, strips)


# ---------------------------------------------------------------- the command


def register(subparsers: Any, parents: Iterable[argparse.ArgumentParser] = (),
             environ: Mapping[str, str] | None = None) -> None:
    """Add ``plot`` to the plugin's subcommands (``parents``: its kubectl flags)."""
    env = os.environ if environ is None else environ
    p = subparsers.add_parser("plot", parents=list(parents),
                              help="a PNG heat map of the fleet's devices and fgd fragmentation")
    p.add_argument("names", nargs="*", metavar="NODE")
    p.add_argument("--out", required=True, help="PNG file to write (-: standard output)")
    p.add_argument("--pool", help="nodes of this pool (label gpu-share.<domain>/pool)")
    p.add_argument("--unhealthy", action="store_true",
                   help="only nodes with an unhealthy device (their unhealthy devices)")
    p.add_argument("--sort", choices=("name", "used", "fgd"), default="name",
                   help="node order: pool then name, most used first, most fragmented first")
    p.add_argument("--default-workload",
                   default=env.get("GPU_SHARE_DEFAULT_WORKLOAD", DEFAULT_WORKLOAD),
                   help="the extender's --default-workload (fgd, while no pod asks)")


def cmd_plot(api: Any, a: argparse.Namespace, settings: Settings) -> int:
    """One LIST of nodes (the selectors of ``nodes``), one of live pods (as ``fit``:
    pending asks count in the fgd workload); draw; write ``--out``."""
    from gpu_share.cli import kubectl_plugin as kp  # the plugin imports this module

    nodes = kp.list_nodes(api, a, settings)
    pods = kp.list_pods(api, a)
    snap = Snapshot.from_lists(nodes, pods, settings)
    for line in node_problems(snap):
        print(f"warning: {line}", file=sys.stderr)
    rows = node_rows(snap, unhealthy_only=a.unhealthy, names=a.names)
    f = fleet(snap, parse_workload(a.default_workload), rows=rows, sort=a.sort)
    if not f.nodes:
        print("No gpu-share devices found.", file=sys.stderr)
    pic = render(f)
    if a.out == "-":
        sys.stdout.buffer.write(pic.png)
    else:
        Path(a.out).write_bytes(pic.png)
        print(f"wrote {a.out}: {pic.width}x{pic.height}, {len(f.nodes)} nodes,"
              f" {len(pic.cells)} devices")
    return 0
