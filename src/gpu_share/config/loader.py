"""Load ``AgentConfig`` from defaults, a YAML file, environment variables and flags.

Precedence, lowest first: built-in defaults < config file < environment
(``GPU_SHARE_*``, nested with ``__``; ``NODE_NAME`` too) < command-line flags.

pydantic-settings reads and merges the layers (``gpu_share.config.settings``); this
module parses the flags, turns validation errors into ``Problem`` lines that name the
file, variable or flag to fix, and dumps the effective config as YAML.

The model is strict (no ``"4"`` or ``true`` for an integer). File values are taken as
YAML typed them; environment variables and flags are text by nature and are converted
explicitly, by the target field's type, before validation.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import ValidationError

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
    # Imported here: only processes that load a config pay for pydantic-settings.
    from pydantic_settings import SettingsError

    from gpu_share.config.settings import LoadInputs, load_settings

    env = dict(os.environ if environ is None else environ)
    path = getattr(ns, "config", None) or env.get(CONFIG_PATH_ENV) or None
    inputs = LoadInputs(env, path)
    flags: dict[str, Any] = {}
    for dest, key_path in _FLAG_KEYS.items():
        if hasattr(ns, dest):
            _set_path(flags, key_path, getattr(ns, dest))
            inputs.flag_origins[key_path] = "--" + dest.replace("_", "-")
    try:
        return load_settings(flags, inputs)
    except ValidationError as exc:
        raise InvalidConfigError(_problems(exc, inputs.origins())) from None
    except SettingsError as exc:
        raise ConfigError(f"invalid environment: {exc}: {exc.__cause__}") from None


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


# --------------------------------------------------------------------------- helpers


def _set_path(data: dict[str, Any], key_path: tuple[str, ...], value: Any) -> None:
    node = data
    for key in key_path[:-1]:
        node = node.setdefault(key, {})
    node[key_path[-1]] = value


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
    # A section refused as a whole (an unknown one): the one source of its keys.
    labels = {label for path, label in origins.items() if path[: len(parts)] == parts}
    return labels.pop() if len(labels) == 1 else ""


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
