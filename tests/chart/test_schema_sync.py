"""values.schema.json's agentConfig part is generated from the pydantic model
(hack/chart-schema.py) and every key of it is described."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import jsonschema
import yaml

from gpu_share.config.model import AgentConfig
from tests.chart.conftest import CHART, EXAMPLES, REPO

GENERATOR = REPO / "hack" / "chart-schema.py"
SCHEMA_PATH = CHART / "values.schema.json"


def _generated() -> str:
    proc = subprocess.run(
        [sys.executable, str(GENERATOR), "--stdout"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_committed_schema_equals_the_generator_output() -> None:
    assert SCHEMA_PATH.read_text() == _generated(), "run hack/chart-schema.py"


def test_check_mode_agrees() -> None:
    proc = subprocess.run(
        [sys.executable, str(GENERATOR), "--check"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr


def _properties(node: dict[str, Any], prefix: str = "") -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    for name, sub in node.get("properties", {}).items():
        out.append((f"{prefix}{name}", sub))
        out += _properties(sub, f"{prefix}{name}.")
    return out


def test_every_agent_config_key_has_a_description_and_its_model_default() -> None:
    node = json.loads(SCHEMA_PATH.read_text())["definitions"]["agentConfig"]
    assert node["description"]
    defaults = AgentConfig().model_dump(mode="json", by_alias=True)
    keys = _properties(node)
    assert len(keys) > 50
    for path, sub in keys:
        assert sub.get("description", "").strip(), f"agentConfig.{path}: no description"
        if sub.get("type") == "object":
            continue
        expected: Any = defaults
        for part in path.split("."):
            expected = expected[part]
        if path == "dummy.faultFile":
            expected = ""  # the chart puts it under hostPaths.stateDir
        assert sub["default"] == expected, path


def test_pools_share_the_generated_definition() -> None:
    schema = json.loads(SCHEMA_PATH.read_text())
    ref = {"$ref": "#/definitions/agentConfig"}
    assert schema["properties"]["agentConfig"] == ref
    assert schema["definitions"]["nodePool"]["properties"]["agentConfig"] == ref


def test_values_and_examples_validate_against_the_schema() -> None:
    validator = jsonschema.Draft7Validator(json.loads(SCHEMA_PATH.read_text()))
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert [e.message for e in validator.iter_errors(values)] == []
    for path in EXAMPLES:
        # Examples are overrides: merged over values.yaml as helm does, they must validate.
        merged = _merge(values, yaml.safe_load(path.read_text()))
        assert [e.message for e in validator.iter_errors(merged)] == [], path.name


def _merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **{k: _merge(base.get(k), v) for k, v in over.items()}}
    return over


def _keys(node: dict[str, Any], path: str) -> list[tuple[str, dict[str, Any]]]:
    """Every property under ``node``, list items' too, as (dotted path, schema)."""
    out: list[tuple[str, dict[str, Any]]] = []
    for name, sub in node.get("properties", {}).items():
        p = f"{path}.{name}" if path else name
        out.append((p, sub))
        out += _keys(sub, p)
    if isinstance(node.get("items"), dict):
        out += _keys(node["items"], f"{path}[]")
    return out


def test_every_key_outside_agent_config_has_a_description() -> None:
    schema = json.loads(SCHEMA_PATH.read_text())
    defs = schema["definitions"]
    keys = _keys(schema, "")
    for name, node in defs.items():
        if name != "agentConfig":
            keys += [(f"#{name}", node), *_keys(node, f"#{name}")]
    assert len(keys) > 150
    agent = {"$ref": "#/definitions/agentConfig"}
    missing = [p for p, n in keys if not n.get("description", "").strip() and n != agent]
    assert missing == []
    assert defs["agentConfig"]["description"]  # what the bare references stand for


def test_values_yaml_is_the_source_of_the_descriptions() -> None:
    """A key commented in values.yaml (`# --`, or a section's plain comment) is described
    by that text in the schema; the generator keeps them equal."""
    sys.path.insert(0, str(REPO / "hack"))
    import chart_values

    texts = chart_values.descriptions()
    schema = json.loads(SCHEMA_PATH.read_text())
    checked = 0
    for path, node in _keys(schema, ""):
        if path in texts and node != {"$ref": "#/definitions/agentConfig"}:
            assert node["description"] == texts[path], path
            checked += 1
    pool = schema["definitions"]["poolSettings"]["properties"]
    assert pool["hostNetwork"]["description"] == texts["poolDefaults.hostNetwork"]
    assert texts["scheduler.extender"] == "Where the extender runs and how it places pods."
    assert "scheduler.extender" not in {d.path for d in chart_values.documented()}  # no row
    assert checked > 120
