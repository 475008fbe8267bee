"""Load ``AgentConfig`` from defaults, a YAML file, environment variables and flags.

Precedence, lowest first: built-in defaults < config file < environment
(``GPU_SHARE_*``, nested with ``__``; ``NODE_NAME`` too) < command-line flags.

Every layer is turned into a dict keyed by the YAML (camelCase) names, the dicts are
deep-merged, and ``AgentConfig`` validates the result once. A record of which layer
set which key lets error messages name the file, variable or flag to fix.

The model is strict (no ``"4"`` or ``true`` for an integer). File values are taken as
YAML typed them; environment variables and flags are text by nature, so they are
converted here, explicitly and by the target field's type, before validation.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from gpu_share.config.model import CONFIG_VERSION, AgentConfig
from gpu_share.errors import ConfigError

SUPPORTED_VERSIONS: tuple[str, ...] = (CONFIG_VERSION,)
ENV_PREFIX = "GPU_SHARE_"
ENV_NESTED_DELIMITER = "__"
# Names the config file; read before the file, so it is not a config key itself.
CONFIG_PATH_ENV = "GPU_SHARE_CONFIG"
# The Downward API usually exposes the node name under this plain name.
DOWNWARD_NODE_NAME_ENV = "NODE_NAME"

# Flag dest -> YAML key path. Only these flags override the config.
_FLAG_KEYS: dict[str, tuple[str, ...]] = {
    "backend": ("backend",),
    "memory_unit_mib": ("memoryUnitMiB",),
    "device_plugin_dir": ("kubelet", "devicePluginDir"),
    "pod_resources_socket": ("kubelet", "podResourcesSocket"),
    "state_dir": ("stateDir",),
    "node_name": ("nodeName",),
    "metrics_port": ("metrics", "port"),
    "log_level": ("logging", "level"),
    "log_format": ("logging", "format"),
    "dummy_device_count": ("dummy", "deviceCount"),
}

Path = tuple[str | int, ...]

# Longest repr of an offending value or key shown in a message.
MAX_SHOWN_CHARS = 100


@dataclass(frozen=True)
class Problem:
    """One reason a configuration is refused.

    ``key`` is the dotted YAML path ("" when no single key is at fault), ``kind`` the
    pydantic error type or a ``ProblemKind``; ``origin`` the file, variable or flag.
    """

    key: str
    kind: str
    message: str
    origin: str = ""

    def line(self) -> str:
        where = f" (from {self.origin})" if self.origin else ""
        if self.kind == "extra_forbidden":
            return f"unknown key '{self.key}'{where}"
        if not self.key:
            return f"{self.message}{where}"
        return f"key '{self.key}': {self.message}{where}"


def format_problems(problems: Sequence[Problem]) -> str:
    """The one text for refused configs (agent log, agent stderr, ``config validate``)."""
    count = len(problems)
    head = f"invalid configuration ({count} problem{'s' if count != 1 else ''}):"
    return "\n".join([head, *("  - " + p.line() for p in problems)])


class InvalidConfigError(ConfigError):
    """A config refused for one or more ``problems`` (all of them listed)."""

    def __init__(self, problems: Sequence[Problem], *, reason: str | None = None) -> None:
        self.problems = tuple(problems)
        super().__init__(format_problems(self.problems), reason=reason)


def shown(value: object) -> str:
    """``repr(value)`` cut to MAX_SHOWN_CHARS: messages never echo unbounded input."""
    text = repr(value)
    if len(text) <= MAX_SHOWN_CHARS:
        return text
    return f"{text[:MAX_SHOWN_CHARS]}... ({len(text)} characters)"


# --------------------------------------------------------------------------- flags


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the config flags to ``parser`` (also usable for admin subcommands).

    Unset flags stay absent from the namespace so they never override lower layers.
    """
    s = argparse.SUPPRESS
    parser.add_argument(
        "--config",
        metavar="PATH",
        default=s,
        help=f"YAML config file (version: {CONFIG_VERSION}); env {CONFIG_PATH_ENV}",
    )
    parser.add_argument("--backend", choices=["nvml", "dummy"], default=s)
    parser.add_argument("--memory-unit-mib", type=flag_int, metavar="MIB", default=s)
    parser.add_argument("--device-plugin-dir", metavar="DIR", default=s)
    parser.add_argument("--pod-resources-socket", metavar="PATH", default=s)
    parser.add_argument("--state-dir", metavar="DIR", default=s)
    parser.add_argument("--node-name", metavar="NAME", default=s)
    parser.add_argument("--metrics-port", type=flag_int, metavar="PORT", default=s)
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default=s)
    parser.add_argument("--log-format", choices=["json", "text"], default=s)
    parser.add_argument("--dummy-device-count", type=flag_int, metavar="N", default=s)


_INT_TEXT = re.compile(r"[+-]?[0-9]{1,20}\Z")  # ASCII digits only (int() takes "٣", "1_0")
_FLOAT_TEXT = re.compile(
    r"[+-]?([0-9]{1,20}(\.[0-9]{0,20})?|\.[0-9]{1,20})([eE][+-]?[0-9]{1,3})?\Z"
)
_BOOL_TEXT = {
    "true": True, "yes": True, "on": True, "1": True,
    "false": False, "no": False, "off": False, "0": False,
}


def flag_int(text: str) -> int:
    """argparse type: a plain ASCII decimal integer, nothing else."""
    if not _INT_TEXT.match(text):
        raise argparse.ArgumentTypeError(f"not a decimal integer: {shown(text)}")
    return int(text)


def from_text(annotation: Any, value: Any) -> Any:
    """Convert an environment variable's text to the field's scalar type.

    Text that does not parse is returned unchanged, so strict validation refuses it
    with the variable's name; values that are not text (JSON lists) pass through.
    """
    if not isinstance(value, str):
        return value
    text = value.strip()
    if annotation is bool:
        flag = _BOOL_TEXT.get(text.lower())
        return value if flag is None else flag
    if annotation is int:
        return int(text) if _INT_TEXT.match(text) else value
    if annotation is float:
        return float(text) if _FLOAT_TEXT.match(text) else value
    return value


def build_arg_parser(prog: str = "gpu-share-plugin") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="gpu-share node agent. Precedence: defaults < --config file < "
        "GPU_SHARE_* environment < flags.",
    )
    add_config_arguments(parser)
    return parser


# --------------------------------------------------------------------------- loading


def load_config(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> AgentConfig:
    """Parse ``argv`` (without the program name) and build the effective config.

    Raises ConfigError (never SystemExit for config problems; argparse still exits on
    unknown flags or ``--help``).
    """
    ns = build_arg_parser().parse_args(list(argv) if argv is not None else None)
    return config_from_namespace(ns, environ)


def config_from_namespace(
    ns: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> AgentConfig:
    """Build the config from parsed flags (see ``add_config_arguments``) and ``environ``."""
    env = dict(os.environ if environ is None else environ)
    origins: dict[Path, str] = {}

    path = getattr(ns, "config", None) or env.get(CONFIG_PATH_ENV) or None
    merged: dict[str, Any] = {}
    if path:
        file_data = read_config_file(path)
        _record(origins, file_data, (), f"file {path}")
        merged = file_data

    env_data = _env_layer(env)
    origins.update(env_data.origins)
    merged = _deep_merge(merged, env_data.values)

    flag_data: dict[str, Any] = {}
    for dest, key_path in _FLAG_KEYS.items():
        if hasattr(ns, dest):
            _set_path(flag_data, key_path, getattr(ns, dest))
            origins[key_path] = "--" + dest.replace("_", "-")
    merged = _deep_merge(merged, flag_data)

    return validate_config(merged, origins)


def read_config_file(path: str) -> dict[str, Any]:
    """Read and version-check one YAML config file; keys stay camelCase."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"config file {path} is not valid YAML{where}: {problem}") from None
    supported = ", ".join(SUPPORTED_VERSIONS)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {path} must be a mapping at the top level, got {type(data).__name__}"
        )
    if "version" not in data:
        raise ConfigError(
            f"config file {path} has no 'version' key; supported versions: {supported}"
        )
    version = data["version"]
    if str(version) not in SUPPORTED_VERSIONS:
        raise ConfigError(
            f"config file {path} has version {version!r}, which this agent does not "
            f"support; supported versions: {supported}"
        )
    return data


def validate_config(
    data: Mapping[str, Any], origins: Mapping[Path, str] | None = None
) -> AgentConfig:
    """Validate a camelCase dict; ValidationError becomes InvalidConfigError listing
    every problem with its key and origin."""
    try:
        return AgentConfig.model_validate(dict(data))
    except ValidationError as exc:
        raise InvalidConfigError(_problems(exc, origins or {})) from None


def dump_config(cfg: AgentConfig) -> str:
    """The effective config as YAML with the file's camelCase keys."""
    data = cfg.model_dump(mode="json", by_alias=True)
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


# --------------------------------------------------------------------------- env layer


class _EnvLayer:
    def __init__(self, values: dict[str, Any], origins: dict[Path, str]) -> None:
        self.values = values
        self.origins = origins


# The environment is read as pydantic-settings' env source read it (case-insensitive
# names, ``__`` for nesting, JSON for lists and sections), written out here because
# importing pydantic-settings cost the agent ~4 MiB and ~40 ms at every start.


def _is_complex(annotation: Any) -> bool:
    """A section (model) or a list: its variable holds JSON."""
    origin = get_origin(annotation) or annotation
    return isinstance(origin, type) and (
        issubclass(origin, BaseModel | list | tuple | set | frozenset | dict)
    )


def _sub_annotation(annotation: Any, key: str) -> Any:
    """The type of field ``key`` (snake or YAML name, any case) of a section, or None."""
    if not _is_model(annotation):
        return None
    for name, info in annotation.model_fields.items():
        if key in (name.lower(), (info.alias or name).lower()):
            return info.annotation
    return None


def _json_env(name: str, text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ConfigError(
            f"invalid environment variable {name}: {exc}; list values are JSON, e.g. "
            'GPU_SHARE_HEALTH__IGNORED_XIDS="[13, 31]"'
        ) from None


def _explode(annotation: Any, prefix: str, env: Mapping[str, tuple[str, str]]) -> dict[str, Any]:
    """``PREFIX__A__B=v`` variables as ``{"a": {"b": v}}`` (keys lower case); a value
    whose field is a list or section is JSON."""
    result: dict[str, Any] = {}
    for key, (name, text) in env.items():
        if not key.startswith(prefix):
            continue
        *keys, last = key[len(prefix):].split(ENV_NESTED_DELIMITER)
        node: Any = result
        target = annotation
        for part in keys:
            target = _sub_annotation(target, part)
            if isinstance(node, dict):
                node = node.setdefault(part, {})
        target = _sub_annotation(target, last)
        value: Any = text
        if target is not None and text and _is_complex(target):
            value = _json_env(name, text)
        if isinstance(node, dict):
            node[last] = value
    return result


def _env_raw(env: Mapping[str, tuple[str, str]]) -> dict[str, Any]:
    """AgentConfig's top-level fields from ``env`` (lower-case name -> (name, value))."""
    out: dict[str, Any] = {}
    for field_name, info in AgentConfig.model_fields.items():
        key = ENV_PREFIX.lower() + field_name
        found = env.get(key)
        if not _is_complex(info.annotation):
            if found is not None:
                out[field_name] = found[1]
            continue
        prefix = key + ENV_NESTED_DELIMITER
        if found is None:
            if nested := _explode(info.annotation, prefix, env):
                out[field_name] = nested
            continue
        # A JSON object is merged with the nested variables; any other JSON value
        # (null: as if unset) hides them.
        value = _json_env(found[0], found[1])
        if isinstance(value, dict):
            out[field_name] = _deep_merge(value, _explode(info.annotation, prefix, env))
        elif value is not None:
            out[field_name] = value
    return out


def _env_layer(environ: Mapping[str, str]) -> _EnvLayer:
    relevant = {
        k.lower(): (k, v)
        for k, v in environ.items()
        if k.upper().startswith(ENV_PREFIX) and k.upper() != CONFIG_PATH_ENV
    }
    raw = _env_raw(relevant)
    values, origins = _to_yaml_keys(AgentConfig, raw, (), (ENV_PREFIX.rstrip("_"),))
    if "nodeName" not in values and environ.get(DOWNWARD_NODE_NAME_ENV):
        values["nodeName"] = environ[DOWNWARD_NODE_NAME_ENV]
        origins[("nodeName",)] = f"env {DOWNWARD_NODE_NAME_ENV}"
    return _EnvLayer(values, origins)


def _to_yaml_keys(
    model: type[BaseModel], raw: Mapping[str, Any], path: Path, env_parts: tuple[str, ...]
) -> tuple[dict[str, Any], dict[Path, str]]:
    """Rename snake_case keys from the env source to the YAML (alias) names."""
    out: dict[str, Any] = {}
    origins: dict[Path, str] = {}
    by_key: dict[str, tuple[str, Any]] = {}
    for name, info in model.model_fields.items():
        yaml_key = info.alias or name
        by_key[name.lower()] = (yaml_key, info.annotation)
        by_key[yaml_key.lower()] = (yaml_key, info.annotation)
    for key, value in raw.items():
        env_name = "_".join(env_parts) + ("_" if len(env_parts) == 1 else "__") + key.upper()
        found = by_key.get(key.lower())
        if found is None:
            # Kept under its own name so validation reports it as an unknown key.
            out[key] = value
            origins[(*path, key)] = f"env {env_name}"
            continue
        yaml_key, annotation = found
        if isinstance(value, dict) and _is_model(annotation):
            sub, sub_origins = _to_yaml_keys(
                annotation, value, (*path, yaml_key), (*env_parts, key.upper())
            )
            out[yaml_key] = sub
            origins.update(sub_origins)
        else:
            out[yaml_key] = from_text(annotation, value)
            origins[(*path, yaml_key)] = f"env {env_name}"
    return out, origins


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


# --------------------------------------------------------------------------- helpers


def _deep_merge(low: Mapping[str, Any], high: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(low)
    for key, value in high.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _set_path(data: dict[str, Any], key_path: tuple[str, ...], value: Any) -> None:
    node = data
    for key in key_path[:-1]:
        node = node.setdefault(key, {})
    node[key_path[-1]] = value


def _record(origins: dict[Path, str], data: Any, path: Path, label: str) -> None:
    if not label:
        return
    if isinstance(data, dict):
        for key, value in data.items():
            _record(origins, value, (*path, str(key)), label)
    else:
        origins[path] = label


def _key_name(loc: Sequence[str | int]) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += ("." if text else "") + part
    return text or "<root>"


def _origin_of(loc: Sequence[str | int], origins: Mapping[Path, str]) -> str:
    # The longest recorded prefix of the error location names its source.
    parts = tuple(loc)
    for end in range(len(parts), 0, -1):
        label = origins.get(parts[:end])
        if label:
            return label
    return ""


def _problems(exc: ValidationError, origins: Mapping[Path, str]) -> list[Problem]:
    out = []
    for err in exc.errors(include_url=False):
        loc = [p for p in err["loc"] if isinstance(p, str | int)]
        key = _key_name(loc)
        if len(key) > MAX_SHOWN_CHARS:
            key = key[:MAX_SHOWN_CHARS] + "..."
        got = err.get("input")
        value = "" if isinstance(got, dict | list) else f", got {shown(got)}"
        out.append(Problem(key, err["type"], f"{err['msg']}{value}", _origin_of(loc, origins)))
    return out
