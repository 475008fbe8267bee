"""The ``dra`` section of the agent config (DRA driver mode)."""

from __future__ import annotations

import pytest

from gpu_share.config.loader import InvalidConfigError, load_config, validate_config
from gpu_share.config.model import AgentConfig, ProblemKind
from gpu_share.sharing.cdi import DYNAMIC_SPEC_DIR


def test_defaults() -> None:
    dra = AgentConfig().dra
    assert dra.enabled is False
    assert dra.driver_name == "gpu-share.vendor.com"
    assert dra.plugin_dir == "/var/lib/kubelet/plugins/gpu-share.vendor.com"
    assert dra.registration_dir == "/var/lib/kubelet/plugins_registry"
    assert dra.cdi_dir == DYNAMIC_SPEC_DIR  # the node agent's CDI spec dir


@pytest.mark.parametrize(
    "name",
    ["", "Gpu.vendor.com", "gpu_share.vendor.com", "-gpu.vendor.com", "gpu..vendor.com",
     "gpu.vendor.com.", "a" * 64, ("a" * 30 + ".") * 2 + "abc"],
)
def test_driver_name_must_be_a_short_dns_subdomain(name: str) -> None:
    with pytest.raises(InvalidConfigError) as info:
        validate_config({"dra": {"driverName": name}})
    assert ("dra.driverName", ProblemKind.INVALID_DRIVER_NAME) in [
        (p.key, p.kind) for p in info.value.problems
    ]


@pytest.mark.parametrize("name", ["gpu.example.com", "a", "x-1." + "b" * 58])
def test_good_driver_names(name: str) -> None:
    assert validate_config({"dra": {"driverName": name}}).dra.driver_name == name


def test_environment_sets_the_section() -> None:
    cfg = load_config([], {"GPU_SHARE_DRA__ENABLED": "true",
                           "GPU_SHARE_DRA__CDI_DIR": "/etc/cdi"})
    assert (cfg.dra.enabled, cfg.dra.cdi_dir) == (True, "/etc/cdi")


def test_unknown_keys_refused() -> None:
    with pytest.raises(InvalidConfigError, match=r"dra\.socket"):
        validate_config({"dra": {"socket": "/x"}})
