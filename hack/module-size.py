#!/usr/bin/env python3
"""Fail when a hand-written module under src/ or a figures doc is too long (part of
`make lint` and of the test command's static checks).

Every .py under src/ except the generated gRPC stubs is at most 500 lines; the two
modules that orchestrate (the node agent, the allocation engine) at most 450, so that
new jobs get modules of their own instead of growing them. The three docs of measured
figures hold the method and today's figures only (earlier runs go to docs/history/): at
most 250 lines each. Prints one line per offender (path, lines, limit) and exits 1;
silent and 0 when all fit. Checks the tree this script is in; standard library only.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 500
TIGHTER = {
    "src/gpu_share/agent/node_agent.py": 450,
    "src/gpu_share/sharing/node/engine.py": 450,
}
DOCS = {"docs/placement.md": 250, "docs/performance.md": 250, "docs/scale.md": 250}
GENERATED = ("src/gpu_share/plugin/proto", "src/gpu_share/dra/proto")


def line_count(path: Path) -> int:
    """Lines as `wc -l` counts them, plus an unterminated last one."""
    data = path.read_bytes()
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def offenders(root: Path) -> list[tuple[str, int, int]]:
    # A renamed orchestrator must not drop out of its tighter bound unnoticed.
    fixed = {**TIGHTER, **DOCS}
    out = [(rel, -1, limit) for rel, limit in fixed.items() if not (root / rel).is_file()]
    out += [(rel, n, limit) for rel, limit in DOCS.items()
            if (root / rel).is_file() and (n := line_count(root / rel)) > limit]
    for path in sorted((root / "src").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if any(rel == g or rel.startswith(g + "/") for g in GENERATED):
            continue
        limit = TIGHTER.get(rel, LIMIT)
        lines = line_count(path)
        if lines > limit:
            out.append((rel, lines, limit))
    return out


def main() -> int:
    found = offenders(ROOT)
    for rel, lines, limit in found:
        print(f"{rel}: missing, limit {limit}" if lines < 0 else
              f"{rel}: {lines} lines, limit {limit}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
