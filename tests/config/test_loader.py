from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpu_share.config.loader import (
    build_arg_parser,
    config_from_namespace,
    dump_config,
    load_config,
    read_config_file,
)
from gpu_share.config.model import AgentConfig, BackendKind
from gpu_share.errors import ConfigError


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return str(path)


def test_defaults_without_any_source() -> None:
    assert load_config([], {}) == AgentConfig()


def test_precedence_defaults_file_env_flags(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "version: v1\nbackend: dummy\nmemoryUnitMiB: 512\nstateDir: /file\n"
        "dummy:\n  deviceCount: 3\n  model: From File\nmetrics:\n  port: 1111\n",
    )
    env = {
        "GPU_SHARE_MEMORY_UNIT_MIB": "256",
        "GPU_SHARE_DUMMY__DEVICE_COUNT": "2",
        "GPU_SHARE_STATE_DIR": "/env",
    }
    cfg = load_config(["--config", path, "--state-dir", "/flag"], env)
    assert cfg.backend == BackendKind.DUMMY  # file over default
    assert cfg.memory_unit_mib == 256  # env over file
    assert cfg.dummy.device_count == 2  # nested env over file
    assert cfg.dummy.model == "From File"  # sibling of an env-set key kept
    assert cfg.state_dir == "/flag"  # flag over env
    assert cfg.metrics.port == 1111
    assert cfg.kubelet == AgentConfig().kubelet  # untouched section: defaults


def test_config_path_from_env(tmp_path: Path) -> None:
    path = write(tmp_path, "version: v1\nnodeName: from-file\n")
    assert load_config([], {"GPU_SHARE_CONFIG": path}).node_name == "from-file"


def test_all_flags() -> None:
    cfg = load_config(
        [
            "--backend",
            "dummy",
            "--memory-unit-mib",
            "128",
            "--device-plugin-dir",
            "/dp",
            "--pod-resources-socket",
            "/pr.sock",
            "--state-dir",
            "/st",
            "--node-name",
            "n9",
            "--metrics-port",
            "0",
            "--log-level",
            "debug",
            "--log-format",
            "text",
            "--dummy-device-count",
            "5",
        ],
        {},
    )
    assert (cfg.backend, cfg.memory_unit_mib, cfg.node_name) == (BackendKind.DUMMY, 128, "n9")
    assert (cfg.kubelet.device_plugin_dir, cfg.kubelet.pod_resources_socket) == ("/dp", "/pr.sock")
    assert (cfg.state_dir, cfg.metrics.port, cfg.dummy.device_count) == ("/st", 0, 5)
    assert (cfg.logging.level, cfg.logging.format) == ("debug", "text")


def test_node_name_from_downward_api_env() -> None:
    assert load_config([], {"NODE_NAME": "n1"}).node_name == "n1"
    both = {"NODE_NAME": "n1", "GPU_SHARE_NODE_NAME": "n2"}
    assert load_config([], both).node_name == "n2"
    assert load_config(["--node-name", "n3"], both).node_name == "n3"


def test_env_lists_as_json_and_unrelated_prefixed_vars_ignored() -> None:
    env = {
        "GPU_SHARE_HEALTH__IGNORED_XIDS": "[13, 43]",
        "GPU_SHARE_RUNTIME__DEVICE_LIST_STRATEGY": '["volume-mounts", "envvar"]',
        "GPU_SHARE_CLUSTER_KEEP": "1",  # not a config key: someone else's variable
        "gpu_share_backend": "dummy",  # names are case-insensitive
    }
    cfg = load_config([], env)
    assert cfg.health.ignored_xids == [13, 43]
    assert [s.value for s in cfg.runtime.device_list_strategy] == ["volume-mounts", "envvar"]
    assert cfg.backend == BackendKind.DUMMY


def test_env_list_not_json_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="GPU_SHARE_HEALTH__IGNORED_XIDS"):
        load_config([], {"GPU_SHARE_HEALTH__IGNORED_XIDS": "13,43", "GPU_SHARE_BACKEND": "dummy"})


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("backend: dummy\n", "has no 'version' key; supported versions: v1"),
        (
            "version: v2\n",
            "version 'v2', which this agent does not support; supported versions: v1",
        ),
        ("", "has no 'version' key"),
        ("- a\n- b\n", "must be a mapping"),
        ("version: v1\nbackend: [unclosed\n", "not valid YAML at line"),
    ],
)
def test_file_errors(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(["--config", write(tmp_path, text)], {})
    assert needle in str(info.value)
    assert "config.yaml" in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        read_config_file(str(tmp_path / "nope.yaml"))


def test_unknown_and_mistyped_keys_are_named(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "version: v1\ndummy:\n  memoryMib: 3\n  deviceCount: many\n"
        "runtime:\n  deviceListStrategy: [envvar, bogus]\n",
    )
    with pytest.raises(ConfigError) as info:
        load_config(["--config", path], {})
    lines = str(info.value).splitlines()
    assert lines[0] == "invalid configuration (3 problems):"
    text = str(info.value)
    assert "unknown key 'dummy.memoryMib'" in text
    assert "key 'dummy.deviceCount'" in text and "'many'" in text
    assert "key 'runtime.deviceListStrategy[1]'" in text
    assert f"(from file {path})" in text


def test_env_errors_name_the_variable() -> None:
    with pytest.raises(ConfigError) as info:
        load_config([], {"GPU_SHARE_DUMMY__DEVICE_COUNT": "-1", "GPU_SHARE_DUMMY__FOO": "x"})
    text = str(info.value)
    assert "key 'dummy.deviceCount'" in text and "env GPU_SHARE_DUMMY__DEVICE_COUNT" in text
    assert "unknown key 'dummy.foo' (from env GPU_SHARE_DUMMY__FOO)" in text


def test_flag_errors_name_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"key 'memoryUnitMiB'.*from --memory-unit-mib"):
        load_config(["--memory-unit-mib", "0"], {})


def test_unset_flags_do_not_override(tmp_path: Path) -> None:
    ns = build_arg_parser().parse_args([])
    assert vars(ns) == {}
    path = write(tmp_path, "version: v1\nlogging:\n  level: error\n")
    ns = build_arg_parser().parse_args(["--config", path])
    assert config_from_namespace(ns, {}).logging.level == "error"


def test_dump_config_roundtrips_through_the_loader(tmp_path: Path) -> None:
    cfg = load_config(["--backend", "dummy", "--memory-unit-mib", "256"], {"NODE_NAME": "n1"})
    text = dump_config(cfg)
    data = yaml.safe_load(text)
    assert data["memoryUnitMiB"] == 256 and data["dummy"]["memoryMiB"] == 16384
    assert "memory_unit_mib" not in text
    assert load_config(["--config", write(tmp_path, text)], {}) == cfg


def test_only_prefixed_variables_are_read() -> None:
    # Field names and camelCase names without the prefix are someone else's variables.
    env = {"VERSION": "v2", "BACKEND": "dummy", "memoryUnitMiB": "3", "MEMORY_UNIT_MIB": "3"}
    assert load_config([], env) == AgentConfig()


def test_env_json_section_merges_and_its_errors_name_the_variable(tmp_path: Path) -> None:
    path = write(tmp_path, "version: v1\ndummy:\n  deviceCount: 3\n  model: F\n")
    env = {"GPU_SHARE_DUMMY": '{"model": "E", "numaNodes": "2"}',
           "GPU_SHARE_DUMMY__UUID_PREFIX": "GPU"}
    cfg = load_config(["--config", path], env)
    assert (cfg.dummy.device_count, cfg.dummy.model) == (3, "E")
    assert (cfg.dummy.numa_nodes, cfg.dummy.uuid_prefix) == (2, "GPU")
    with pytest.raises(ConfigError) as info:
        load_config(["--config", path], {"GPU_SHARE_DUMMY": '{"deviceCount": -5}'})
    assert "key 'dummy.deviceCount'" in str(info.value)
    assert "(from env GPU_SHARE_DUMMY)" in str(info.value)


def test_unknown_nested_section_names_its_variable() -> None:
    with pytest.raises(ConfigError) as info:
        load_config([], {"GPU_SHARE_DUMMY__FOO__BAR": "1"})
    assert "unknown key 'dummy.foo' (from env GPU_SHARE_DUMMY__FOO__BAR)" in str(info.value)


def test_non_string_keys_in_the_file_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "version: v1\n1: x\n")
    with pytest.raises(ConfigError, match="Keys should be strings"):
        load_config(["--config", path], {})


def test_errors_name_the_layer_that_won(tmp_path: Path) -> None:
    path = write(tmp_path, "version: v1\nmemoryUnitMiB: 512\nmetrics:\n  port: 1\n")
    with pytest.raises(ConfigError) as info:
        load_config(["--config", path, "--memory-unit-mib", "0"],
                    {"GPU_SHARE_MEMORY_UNIT_MIB": "256", "GPU_SHARE_METRICS__PORT": "-1"})
    text = str(info.value)
    assert "key 'memoryUnitMiB': Input should be greater than or equal to 1, got 0 " \
        "(from --memory-unit-mib)" in text
    assert "(from env GPU_SHARE_METRICS__PORT)" in text
