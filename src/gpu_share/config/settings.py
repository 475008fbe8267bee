"""The pydantic-settings side of the loader: ``AgentSettings`` and its sources.

``AgentSettings`` is ``AgentConfig`` as a ``BaseSettings``; ``settings_customise_sources``
orders the layers: flags (init keywords) > ``GPU_SHARE_*`` environment > YAML file >
defaults. The library reads and merges; what it does not do is added here:

- the environment and the file path come per load (``LoadInputs``), not from the process;
- env text is converted by ``from_text`` (the library's own conversion is lax: "4.0" and
  "1_024" would become integers) and keys are renamed to the YAML names, so errors
  name the YAML key;
- ``NODE_NAME`` (Downward API) fills ``nodeName`` when ``GPU_SHARE_NODE_NAME`` is unset;
- every source records which file, variable or flag set each key (``origins``).

``_load_env_vars``, ``_coerce_env_val_strict`` and ``_read_files`` override underscore
methods of the library's sources (pydantic-settings 2.x); tests/config covers them.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from gpu_share.config.loader import (
    CONFIG_PATH_ENV,
    DOWNWARD_NODE_NAME_ENV,
    ENV_NESTED_DELIMITER,
    ENV_PREFIX,
    from_text,
    read_config_file,
)
from gpu_share.config.model import AgentConfig
from gpu_share.errors import ConfigError

Path = tuple[str | int, ...]


@dataclass
class LoadInputs:
    """What one load reads besides the flags, and where each key came from; kept per
    layer because the sources run in no particular order."""

    environ: Mapping[str, str]
    config_path: str | None
    file_origins: dict[Path, str] = field(default_factory=dict)
    env_origins: dict[Path, str] = field(default_factory=dict)
    flag_origins: dict[Path, str] = field(default_factory=dict)

    def origins(self) -> dict[Path, str]:
        """Key path -> its file, variable or flag; a higher layer wins."""
        return {**self.file_origins, **self.env_origins, **self.flag_origins}


# settings_customise_sources is a classmethod: the inputs of the load in progress reach
# it through this variable (set by load_settings only, per thread/task).
_INPUTS: ContextVar[LoadInputs] = ContextVar("gpu_share_config_inputs")


class AgentSettings(BaseSettings, AgentConfig):
    """AgentConfig read from flags, environment and file (see the module docstring)."""

    model_config = SettingsConfigDict(
        # File and flag keys exactly as the model names them (the env source below
        # matches variable names case-insensitively on its own).
        case_sensitive=True,
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER,
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        inputs = _INPUTS.get()
        sources: list[PydanticBaseSettingsSource] = [
            init_settings,
            _EnvSource(settings_cls, inputs),
        ]
        if inputs.config_path:
            sources.append(_FileSource(settings_cls, inputs))
        return tuple(sources)


def load_settings(flags: Mapping[str, Any], inputs: LoadInputs) -> AgentConfig:
    """Merge and validate; ``inputs.origins()`` names each key's source afterwards (also
    when validation fails)."""
    token = _INPUTS.set(inputs)
    try:
        settings = AgentSettings(**flags)
    finally:
        _INPUTS.reset(token)
    # Already validated: hand out the plain model, field for field.
    values = {name: getattr(settings, name) for name in AgentConfig.model_fields}
    return AgentConfig.model_construct(settings.model_fields_set, **values)


class _FileSource(YamlConfigSettingsSource):
    """The one named YAML file, read and version-checked by ``read_config_file``."""

    def __init__(self, settings_cls: type[BaseSettings], inputs: LoadInputs) -> None:
        self._inputs = inputs
        super().__init__(settings_cls, yaml_file=inputs.config_path)

    def _read_files(self, files: Any, deep_merge: bool = False) -> dict[str, Any]:
        # Instead of the library's reading: a missing file is an error, and every
        # error names the file.
        path = str(files)
        data = read_config_file(path)
        _record(self._inputs.file_origins, data, (), f"file {path}")
        if not all(isinstance(key, str) for key in data):
            # Keyword arguments cannot carry them: let the model refuse the file alone.
            AgentConfig.model_validate(data)
        return data


class _EnvSource(EnvSettingsSource):
    """``GPU_SHARE_*`` from ``inputs.environ``, case-insensitive, lists and sections JSON."""

    def __init__(self, settings_cls: type[BaseSettings], inputs: LoadInputs) -> None:
        self._inputs = inputs
        # Lower-case name -> the name as set, for messages.
        self._names = {k.lower(): k for k in inputs.environ}
        super().__init__(settings_cls, case_sensitive=False)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        # Only GPU_SHARE_* names: the library also tries a field's camelCase name
        # unprefixed (a bare VERSION or BACKEND must not count).
        prefix = ENV_PREFIX.lower()
        lowered = ((k.lower(), v) for k, v in self._inputs.environ.items())
        return {k: v for k, v in lowered if k.startswith(prefix)}

    def _coerce_env_val_strict(self, field: FieldInfo | None, value: Any) -> Any:
        # Text is converted once, by from_text, when keys are renamed (__call__).
        return value

    def decode_complex_value(self, field_name: str, field: FieldInfo, value: Any) -> Any:
        try:
            return super().decode_complex_value(field_name, field, value)
        except ValueError as exc:
            name = self._variable_of(field_name, value)
            raise ConfigError(
                f"invalid environment variable {name}: {exc}; list values are JSON, e.g. "
                'GPU_SHARE_HEALTH__IGNORED_XIDS="[13, 31]"'
            ) from None

    def _variable_of(self, key: str, value: Any) -> str:
        """The variable holding ``value`` whose name ends in ``key`` (as it was set)."""
        key = key.lower()
        for name, text in self.env_vars.items():
            tail = name.rsplit(ENV_NESTED_DELIMITER, 1)[-1].removeprefix(ENV_PREFIX.lower())
            if text == value and tail == key:
                return self._names.get(name, name.upper())
        return (ENV_PREFIX + key).upper()

    def __call__(self) -> dict[str, Any]:
        variables = _variable_paths(self._inputs.environ)
        values = _yaml_keys(AgentConfig, super().__call__())
        if "nodeName" not in values and self._inputs.environ.get(DOWNWARD_NODE_NAME_ENV):
            values["nodeName"] = self._inputs.environ[DOWNWARD_NODE_NAME_ENV]
            variables[("nodeName",)] = DOWNWARD_NODE_NAME_ENV
        _record_env(self._inputs.env_origins, values, (), variables)
        return values


# --------------------------------------------------------------------------- helpers


def _field_keys(model: Any) -> dict[str, tuple[str, Any]]:
    """Lower-case field name and YAML name -> (YAML name, annotation); {} if no model."""
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return {}
    out: dict[str, tuple[str, Any]] = {}
    for name, info in model.model_fields.items():
        yaml_key = info.alias or name
        out[name.lower()] = out[yaml_key.lower()] = (yaml_key, info.annotation)
    return out


def _yaml_keys(model: Any, raw: Mapping[str, Any]) -> dict[str, Any]:
    """Keys renamed to the YAML names, text converted by field type; keys that name no
    field are kept so validation refuses them by name."""
    fields = _field_keys(model)
    out: dict[str, Any] = {}
    for key, value in raw.items():
        yaml_key, annotation = fields.get(str(key).lower(), (key, None))
        if isinstance(value, dict):
            out[yaml_key] = _yaml_keys(annotation, value)
        else:
            out[yaml_key] = from_text(annotation, value)
    return out


def _variable_paths(environ: Mapping[str, str]) -> dict[Path, str]:
    """YAML key path -> the ``GPU_SHARE_*`` variable that names it."""
    out: dict[Path, str] = {}
    for name in environ:
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper == CONFIG_PATH_ENV:
            continue
        model: Any = AgentConfig
        path: list[str | int] = []
        for part in name[len(ENV_PREFIX):].split(ENV_NESTED_DELIMITER):
            yaml_key, model = _field_keys(model).get(part.lower(), (part.lower(), None))
            path.append(yaml_key)
        out[tuple(path)] = name
    return out


def _record_env(origins: dict[Path, str], data: Any, path: Path,
                variables: Mapping[Path, str]) -> None:
    # Each leaf: the variable of its longest path prefix (a section's JSON, or its own).
    if isinstance(data, dict):
        for key, value in data.items():
            _record_env(origins, value, (*path, key), variables)
        return
    for end in range(len(path), 0, -1):
        if path[:end] in variables:
            origins[path] = f"env {variables[path[:end]]}"
            return


def _record(origins: dict[Path, str], data: Any, path: Path, label: str) -> None:
    if isinstance(data, dict):
        for key, value in data.items():
            _record(origins, value, (*path, str(key)), label)
    else:
        origins[path] = label
