#!/usr/bin/env python3
"""Regenerate the generated parts of charts/gpu-share/values.schema.json.

`definitions.agentConfig` (used by `agentConfig` and by each pool's `agentConfig`) comes
from the pydantic model gpu_share.config.model.AgentConfig: keys (camelCase aliases),
types, enums, bounds and defaults. Descriptions: a field's own pydantic description, else
its `# --` comment in values.yaml (the text the chart README shows); objects take their
model class's docstring.

The rest of the schema (types, bounds, patterns) is written by hand; only its
descriptions are generated: every key with a comment right above it in values.yaml (its
`# --` text, or a section's plain comment block) gets that text, so values.yaml is their
one source. Keys values.yaml cannot comment (list items, the leaves of a map documented as
a whole, `global`) keep the description written in the schema.

    hack/chart-schema.py            rewrite the file
    hack/chart-schema.py --check    exit 1 when the committed file differs
    hack/chart-schema.py --stdout   print what the file should hold

No network, no helm: run inside the project's virtualenv.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chart_values import CHART, CHART_OWNED, descriptions, documented, generator_main

from gpu_share.config.model import AgentConfig

SCHEMA = CHART / "values.schema.json"

_ABS_PATH = {"type": "string", "pattern": "^/.*[^/]$|^/$"}
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_DNS_LABEL = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"

# Where the chart checks more than the model's JSON schema can say (the model does it in
# validators: domain and driver names, unique strategies) or demands more than the agent
# (host paths the chart mounts must be absolute; the metrics port is a container port).
# Each entry replaces or adds constraints of that key.
CHART_RULES: dict[str, dict[str, Any]] = {
    "resources.domain": {
        "pattern": r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$",
        "maxLength": 243,
    },
    "resources.memoryName": {"pattern": _DNS_LABEL},
    "resources.coreName": {"pattern": _DNS_LABEL},
    "runtime.deviceListStrategy": {"uniqueItems": True},
    "runtime.mps.pipeDir": _ABS_PATH,
    "runtime.mps.logDir": _ABS_PATH,
    "runtime.hamiCore.libraryPath": _ABS_PATH,
    "runtime.hamiCore.preloadPath": _ABS_PATH,
    "runtime.hamiCore.cacheDir": _ABS_PATH,
    "runtime.nvidiaMemoryLimits.hookPath": _ABS_PATH,
    "runtime.nvidiaMemoryLimits.driverRoot": _ABS_PATH,
    "dummy.model": {"minLength": 1},
    "dummy.hostDevicePath": _ABS_PATH,
    # Empty: the chart puts it in hostPaths.stateDir (the only host dir mounted for it).
    "dummy.faultFile": {"pattern": "^$|^/.*[^/]$", "default": ""},
    "metrics.bindAddress": {"minLength": 1},
    "metrics.port": {"minimum": 1},
    "dra.driverName": {"pattern": _DNS_SUBDOMAIN, "maxLength": 63},
}

# pydantic's annotations that are no part of what the chart documents or checks.
_DROP = frozenset({"title", "default", "description"})


def _one_line(text: str) -> str:
    first = text.strip().split("\n\n")[0]
    return " ".join(first.split())


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    """``node`` with every local $ref replaced by its definition."""
    if isinstance(node, list):
        return [_inline(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        return _inline({**target, **{k: v for k, v in node.items() if k != "$ref"}}, defs)
    return {k: _inline(v, defs) for k, v in node.items()}


def _submodel(cls: type[BaseModel], name: str) -> type[BaseModel] | None:
    for field_name, field in cls.model_fields.items():
        if (field.alias or field_name) == name:
            sub = field.annotation
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                return sub
    return None


def _field_description(cls: type[BaseModel], name: str) -> str | None:
    for field_name, field in cls.model_fields.items():
        if (field.alias or field_name) == name:
            return field.description
    return None


def _leaf(
    raw: dict[str, Any], path: str, description: str, default: Any
) -> dict[str, Any]:
    rules = CHART_RULES.get(path, {})
    node: dict[str, Any] = {"description": description}
    node.update({k: v for k, v in raw.items() if k not in _DROP})
    if "items" in node:
        node["items"] = {k: v for k, v in node["items"].items() if k not in _DROP}
    node.update({k: v for k, v in rules.items() if k != "default"})
    node["default"] = rules.get("default", default)
    return node


def _object(
    cls: type[BaseModel],
    raw: dict[str, Any],
    prefix: str,
    docs: dict[str, str],
    defaults: dict[str, Any],
) -> dict[str, Any]:
    props: dict[str, Any] = {}
    for name, sub in raw["properties"].items():
        path = f"{prefix}{name}"
        if path in CHART_OWNED:
            continue
        model = _submodel(cls, name)
        if model is not None:
            props[name] = _object(model, sub, f"{path}.", docs, defaults[name])
            continue
        description = _field_description(cls, name) or docs.get(path)
        if not description:
            raise SystemExit(f"agentConfig.{path}: no description (pydantic or values.yaml)")
        props[name] = _leaf(sub, path, description, defaults[name])
    if not cls.__doc__:
        raise SystemExit(f"{cls.__name__}: no docstring to describe agentConfig.{prefix}")
    return {
        "description": _one_line(cls.__doc__),
        "type": "object",
        "additionalProperties": False,
        "properties": props,
    }


def agent_config_schema() -> dict[str, Any]:
    """The chart's `definitions.agentConfig`."""
    raw = AgentConfig.model_json_schema(by_alias=True, mode="validation")
    inlined = _inline({k: v for k, v in raw.items() if k != "$defs"}, raw.get("$defs", {}))
    docs = {
        d.path.removeprefix("agentConfig."): d.description
        for d in documented()
        if d.path.startswith("agentConfig.")
    }
    defaults = AgentConfig().model_dump(mode="json", by_alias=True)
    node = _object(AgentConfig, inlined, "", docs, defaults)
    node["description"] = (
        "The agent's config file (AgentConfig v1, camelCase keys); the chart sets version, "
        "nodeName, stateDir, the kubelet paths and the DRA dirs itself."
    )
    return node


# Definitions whose properties are documented under a values.yaml key.
DEFINITION_DOCS = {"image": "image", "poolSettings": "poolDefaults", "nodePool": "poolDefaults"}
_AGENT_REF = {"$ref": "#/definitions/agentConfig"}


def _described(node: dict[str, Any], path: str, docs: dict[str, str]) -> dict[str, Any]:
    """``node`` with the values.yaml description of ``path`` (first, for readers) and its
    properties described alike. A reference to agentConfig stays bare: the generated
    definition describes it, and every pool refers to that one definition."""
    if node == _AGENT_REF:
        return node
    out = dict(node)
    if "properties" in out:
        out["properties"] = {
            k: _described(v, f"{path}.{k}" if path else k, docs)
            for k, v in out["properties"].items()
        }
    text = docs.get(path)
    if text is None:
        return out
    return {"description": text, **{k: v for k, v in out.items() if k != "description"}}


def describe(schema: dict[str, Any], docs: dict[str, str]) -> dict[str, Any]:
    """The hand-written part of ``schema`` with values.yaml's descriptions."""
    out = _described(schema, "", docs)
    defs = dict(out["definitions"])
    for name, prefix in DEFINITION_DOCS.items():
        props = defs[name]["properties"]
        defs[name] = {**defs[name], "properties": {
            k: _described(v, f"{prefix}.{k}", docs) for k, v in props.items()}}
    out["definitions"] = defs
    return out


def render(current: str) -> str:
    schema = copy.deepcopy(json.loads(current))
    schema["definitions"]["agentConfig"] = agent_config_schema()
    schema = describe(schema, descriptions())
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    return generator_main(
        argv, __doc__.split("\n\n")[0], SCHEMA, "the file",
        lambda: render(SCHEMA.read_text()), "hack/chart-schema.py",
    )


if __name__ == "__main__":
    raise SystemExit(main())
