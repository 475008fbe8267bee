"""Every config field is strictly typed in the file; env and flags convert explicitly.

Before: ``memoryUnitMiB: true`` / ``"4"`` / ``4.0`` (and the like for every field) were
coerced by pydantic's lax mode.
"""

from __future__ import annotations

import typing
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from gpu_share.config.loader import InvalidConfigError, load_config, validate_config
from gpu_share.config.model import (
    MAX_DOMAIN_LENGTH,
    AgentConfig,
    ProblemKind,
    domain_problem,
)


def leaf_fields(model: type[BaseModel], path: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], Any]]:
    for name, info in model.model_fields.items():
        key = (*path, info.alias or name)
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from leaf_fields(ann, key)
        else:
            yield key, ann


def wrong_values(ann: Any) -> list[object]:
    """Values of the wrong type that lax validation would have coerced."""
    if ann is bool:
        return [1, 0, "true", "yes"]
    if ann is int:
        return [True, "4", 4.0]
    if ann is float:
        return [True, "1.5"]
    if ann is str:
        return [1, True, b"x"]
    if isinstance(ann, type) and issubclass(ann, Enum):
        return [1, True, b"x"]
    origin = typing.get_origin(ann)
    if origin is typing.Literal:
        return [1, True, b"x"]
    if origin is list:
        return [("a",), "x"]
    raise AssertionError(f"no wrong values for {ann!r}: add them")


FIELDS = list(leaf_fields(AgentConfig))
# version is checked (and named) by read_config_file before the model sees it.
CASES = [(key, bad) for key, ann in FIELDS if key != ("version",) for bad in wrong_values(ann)]


def nested(key: tuple[str, ...], value: object) -> dict[str, Any]:
    data: dict[str, Any] = {"version": "v1"}
    node = data
    for part in key[:-1]:
        node = node.setdefault(part, {})
    node[key[-1]] = value
    return data


def test_every_field_is_covered() -> None:
    assert len(FIELDS) > 30  # the walk reached the nested sections


@pytest.mark.parametrize(("key", "bad"), CASES, ids=[f"{'.'.join(k)}={b!r}" for k, b in CASES])
def test_wrong_type_refused_for_every_field(key: tuple[str, ...], bad: object) -> None:
    with pytest.raises(InvalidConfigError) as info:
        validate_config(nested(key, bad))
    assert ".".join(key) in [p.key for p in info.value.problems]


def write(tmp_path: Path, data: dict[str, Any]) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_env_text_is_converted_but_the_same_text_in_the_file_is_refused(
    tmp_path: Path,
) -> None:
    env = {
        "GPU_SHARE_MEMORY_UNIT_MIB": "256",
        "GPU_SHARE_FAIL_ON_INIT_ERROR": "false",
        "GPU_SHARE_HEALTH__POLL_INTERVAL_SECONDS": "0.5",
        "GPU_SHARE_DUMMY__DEVICE_COUNT": " 3 ",
        "GPU_SHARE_PUBLISH__EVENTS": "off",
    }
    cfg = load_config([], env)
    assert cfg.memory_unit_mib == 256 and cfg.fail_on_init_error is False
    assert cfg.health.poll_interval_seconds == 0.5 and cfg.dummy.device_count == 3
    assert cfg.publish.events is False
    with pytest.raises(InvalidConfigError):
        load_config(["--config", write(tmp_path, {"version": "v1", "memoryUnitMiB": "256"})],
                    {})
    # Precedence holds: env over file, flag over env.
    path = write(tmp_path, {"version": "v1", "memoryUnitMiB": 512})
    assert load_config(["--config", path], env).memory_unit_mib == 256
    assert load_config(["--config", path, "--memory-unit-mib", "128"], env
                       ).memory_unit_mib == 128


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("GPU_SHARE_MEMORY_UNIT_MIB", "4.0"),
        ("GPU_SHARE_MEMORY_UNIT_MIB", "٣"),  # not ASCII digits
        ("GPU_SHARE_MEMORY_UNIT_MIB", "1_024"),
        ("GPU_SHARE_MEMORY_UNIT_MIB", "many"),
        ("GPU_SHARE_FAIL_ON_INIT_ERROR", "maybe"),
        ("GPU_SHARE_HEALTH__POLL_INTERVAL_SECONDS", "nan"),
        ("GPU_SHARE_HEALTH__IGNORED_XIDS", '["13"]'),
    ],
)
def test_env_text_that_does_not_parse_is_refused_naming_the_variable(
    name: str, text: str
) -> None:
    with pytest.raises(InvalidConfigError) as info:
        load_config([], {name: text})
    assert f"env {name}" in str(info.value)


@pytest.mark.parametrize("text", ["٣", "1_0", "4.0", " "])
def test_integer_flags_take_ascii_digits_only(
    text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        load_config(["--memory-unit-mib", text], {})
    assert info.value.code == 2
    assert "not a decimal integer" in capsys.readouterr().err


@pytest.mark.parametrize(
    "domain",
    [
        "",
        "a" * 300,
        "a" * (MAX_DOMAIN_LENGTH + 1),
        ("a" * 63 + ".") * 3 + "a" * 60,  # 252 characters: fine for DNS, not for keys
        "b" * 64 + ".com",  # a label over 63
        "Vendor.com",
        "vendor..com",
        "-vendor.com",
        "vendor.com.",
        "kubernetes.io",
        "gpu.kubernetes.io",
        "requests.vendor.com",
        "vendor.com/x",
    ],
)
def test_bad_domains_refused(domain: str) -> None:
    assert domain_problem(domain)
    with pytest.raises(InvalidConfigError) as info:
        validate_config({"resources": {"domain": domain}})
    assert ("resources.domain", ProblemKind.INVALID_DOMAIN) in [
        (p.key, p.kind) for p in info.value.problems
    ]


@pytest.mark.parametrize(
    "domain",
    ["vendor.com", "a", "x-1.example.org", ("a" * 63 + ".") * 3 + "a" * (MAX_DOMAIN_LENGTH - 192)],
)
def test_good_domains_accepted(domain: str) -> None:
    assert len(domain) <= MAX_DOMAIN_LENGTH
    assert validate_config({"resources": {"domain": domain}}).resources.domain == domain
    # The annotation prefix stays a DNS subdomain.
    assert len(f"gpu-share.{domain}") <= 253


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("vcuda-memory", True),
        ("Mem_1.x", True),  # the qualified-name charset
        ("m" * 63, True),
        ("m" * 64, False),
        ("-mem", False),
        ("mem/x", False),
        ("", False),
    ],
)
def test_resource_names_are_qualified_names(name: str, ok: bool) -> None:
    data = {"resources": {"memoryName": name}}
    if ok:
        assert validate_config(data).resources.memory_resource == f"vendor.com/{name}"
    else:
        with pytest.raises(InvalidConfigError):
            validate_config(data)


@pytest.mark.parametrize(
    ("health", "ok"),
    [
        ({"ignoredXids": [13], "fatalXids": [79]}, True),
        ({"ignoredXids": [13, 79], "fatalXids": [79]}, False),
        ({"fatalXids": [13]}, False),  # 13 is ignored by default
        ({"ignoredXids": [], "fatalXids": [13]}, False),  # empty: the defaults apply
        ({"ignoredXids": [79]}, False),  # 79 is fatal by default
        ({"ignoredXids": [0]}, False),
        ({"fatalXids": [70000]}, False),
        ({"ignoredXids": list(range(1, 300))}, False),
        ({"recoveryQuietSeconds": float("inf")}, False),
    ],
)
def test_health_xids(health: dict[str, Any], ok: bool) -> None:
    if ok:
        validate_config({"health": health})
    else:
        with pytest.raises(InvalidConfigError):
            validate_config({"health": health})


def test_memory_unit_bounds() -> None:
    for bad in (0, -1, 1024 * 1024 + 1):
        with pytest.raises(InvalidConfigError):
            validate_config({"memoryUnitMiB": bad})
    for good in (1, 1024, 1024 * 1024):
        assert validate_config({"memoryUnitMiB": good}).memory_unit_mib == good


def test_long_values_are_not_echoed_whole() -> None:
    with pytest.raises(InvalidConfigError) as info:
        validate_config({"nodeName": 7, "logging": {"level": "x" * 5000}})
    assert "x" * 200 not in str(info.value)
    assert "characters)" in str(info.value)
