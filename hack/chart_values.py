"""The `# --` documentation comments of charts/gpu-share/values.yaml (helm-docs' convention).

A comment block starting with `# --` documents the key right below it; the following
`#` lines continue it. Plain comments (without `--`) document nothing. Keys inside list
items (e.g. the entries of `tolerations`) are part of their list's default, not keys.
Used by hack/chart-readme.py and hack/chart-schema.py, with their one command line
(``generator_main``); no network, no helm.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "gpu-share"
VALUES = CHART / "values.yaml"

_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.-]+):(?:\s|$)")
_DOC = re.compile(r"^ *# -- ?(?P<text>.*)$")
_MORE = re.compile(r"^ *#(?: (?P<text>.*))?$")


@dataclass(frozen=True)
class Documented:
    path: str  # dotted key, e.g. "agentConfig.dummy.deviceCount"
    description: str
    value: Any  # the default in values.yaml


def _lookup(values: Any, path: str) -> Any:
    node = values
    for part in path.split("."):
        node = node[part]
    return node


def _scan(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """({dotted key: its `# --` description}, {dotted key: the plain comment block right
    above it}), in file order. A plain block documents a section (a map such as
    `scheduler.extender`) for the schema, not a README row."""
    docs: dict[str, str] = {}
    sections: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] | None = None
    plain: list[str] = []
    list_owner = -1  # indent of the key whose list items are being skipped
    for line in text.splitlines():
        if m := _DOC.match(line):
            pending, plain = [m["text"].strip()], []
            continue
        if m := _MORE.match(line):
            (plain if pending is None else pending).append((m["text"] or "").strip())
            continue
        if not line.strip() or line.lstrip().startswith("#"):
            pending, plain = None, []
            continue
        indent = len(line) - len(line.lstrip())
        above, plain = plain, []
        if line.lstrip().startswith("-"):
            list_owner = stack[-1][0] if stack else -1
            continue
        key = _KEY.match(line)
        if key is None or (list_owner >= 0 and indent > list_owner):
            continue
        list_owner = -1
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key["key"]))
        path = ".".join(k for _, k in stack)
        if pending is not None:
            docs[path] = " ".join(p for p in pending if p)
        elif above:
            sections[path] = " ".join(p for p in above if p)
        pending = None
    return docs, sections


def documented(path: Path = VALUES) -> list[Documented]:
    """Every documented key of ``path`` with its description and default, in file order."""
    text = path.read_text()
    values = yaml.safe_load(text)
    return [Documented(k, d, _lookup(values, k)) for k, d in _scan(text)[0].items()]


def descriptions(path: Path = VALUES) -> dict[str, str]:
    """Every key of ``path`` that has a comment right above it: its `# --` text, or for a
    section (a map without one) its plain comment block. values.schema.json's
    descriptions outside agentConfig come from here (hack/chart-schema.py)."""
    docs, sections = _scan(path.read_text())
    return {**sections, **docs}


def leaves(values: Any, prefix: str = "") -> list[str]:
    """Dotted paths of every non-map value (a non-empty map is walked into)."""
    if not isinstance(values, dict) or not values:
        return [prefix]
    out: list[str] = []
    for key, sub in values.items():
        out += leaves(sub, f"{prefix}.{key}" if prefix else key)
    return out


# Keys the chart sets itself (hostPaths, the Downward API) or pins: not values.
CHART_OWNED = frozenset(
    {
        "version",
        "nodeName",
        "stateDir",
        "kubelet.devicePluginDir",
        "kubelet.podResourcesSocket",
        "metrics.enabled",
        "dra.pluginDir",
        "runtime.nvidiaMemoryLimits.checkPath",
        "dra.registrationDir",
        "dra.cdiDir",
    }
)


def generator_main(
    argv: Sequence[str] | None, description: str, target: Path, what: str,
    render: Callable[[], str], script: str,
) -> int:
    """The command line of a generator of ``target`` (``what`` it is, for --help):
    write ``render()`` there; --stdout prints it instead; --check exits 1 (naming
    ``script`` to run) when the file is missing or differs."""
    parser = argparse.ArgumentParser(description=description)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help=f"exit 1 when {what} is stale")
    mode.add_argument("--stdout", action="store_true", help="print instead of writing")
    args = parser.parse_args(argv)
    wanted = render()
    if args.stdout:
        sys.stdout.write(wanted)
        return 0
    if args.check:
        if not target.is_file() or target.read_text() != wanted:
            print(f"{target} is stale: run {script}", file=sys.stderr)
            return 1
        return 0
    target.write_text(wanted)
    return 0
