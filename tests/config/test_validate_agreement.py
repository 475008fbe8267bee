"""``gpu-share config validate`` and the agent reach the same verdict, with one message.

The agent's side is what ``gpu-share-plugin`` runs before serving: ``load_config`` (its
``main``), then ``_guard_sizes`` on the started backend's devices (its ``run``). Five
cases were once accepted by validate and refused (or mishandled) by the agent; each is
now refused by both, with the same key, kind and text.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import yaml

from gpu_share.cli import admin, plugin_main
from gpu_share.config.loader import InvalidConfigError, load_config
from gpu_share.config.model import BackendKind, ProblemKind
from gpu_share.devices.base import Device
from gpu_share.devices.factory import start_backend
from gpu_share.errors import ConfigError
from gpu_share.plugin.sizeguard import described_devices, unit_list_size
from gpu_share.sharing.ids import unit_id
from gpu_share.sharing.model import ResourceKind


@dataclass(frozen=True)
class Case:
    name: str
    config: dict[str, object]
    key: str
    kind: str
    # For backend nvml: the node described to validate (count, MiB); the agent gets
    # devices of that shape as NVML reports them.
    nvml: tuple[int, int] | None = None


def dummy(**extra: object) -> dict[str, object]:
    return {"version": "v1", "backend": "dummy", **extra}


CASES = [
    Case(
        "unit-size-list-too-large-dummy",
        dummy(memoryUnitMiB=1, dummy={"deviceCount": 64, "memoryMiB": 81920}),
        "memoryUnitMiB",
        ProblemKind.DEVICE_LIST_TOO_LARGE,
    ),
    Case(
        "unit-size-list-too-large-nvml",
        {"version": "v1", "backend": "nvml", "memoryUnitMiB": 1},
        "memoryUnitMiB",
        ProblemKind.DEVICE_LIST_TOO_LARGE,
        nvml=(8, 81920),
    ),
    Case("unit-true", dummy(memoryUnitMiB=True), "memoryUnitMiB", "int_type"),
    Case("unit-string", dummy(memoryUnitMiB="4"), "memoryUnitMiB", "int_type"),
    Case("unit-float", dummy(memoryUnitMiB=4.0), "memoryUnitMiB", "int_type"),
    Case(
        "xid-ignored-and-fatal",
        dummy(health={"ignoredXids": [13, 31], "fatalXids": [31, 79]}),
        "health.fatalXids",
        ProblemKind.XID_CONFLICT,
    ),
    Case(
        "domain-300-chars",
        dummy(resources={"domain": "a" * 300}),
        "resources.domain",
        ProblemKind.INVALID_DOMAIN,
    ),
    Case(
        "device-smaller-than-unit",
        dummy(memoryUnitMiB=1024, dummy={"deviceCount": 2, "memoryMiB": 512}),
        "memoryUnitMiB",
        ProblemKind.DEVICE_SMALLER_THAN_UNIT,
    ),
    Case(
        "device-smaller-than-unit-nvml",
        {"version": "v1", "backend": "nvml", "memoryUnitMiB": 4096},
        "memoryUnitMiB",
        ProblemKind.DEVICE_SMALLER_THAN_UNIT,
        nvml=(2, 2048),
    ),
]


def write(tmp_path: Path, config: dict[str, object]) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def nvml_devices(count: int, memory_mib: int) -> list[Device]:
    """Devices as the NVML backend reports them (real-format uuids, NUMA 0)."""
    return [
        Device(
            uuid=f"GPU-{i:08x}-5c2e-11ee-9a3b-0242ac120002",
            index=i,
            minor=i,
            memory_mib=memory_mib,
            model="NVIDIA H100 80GB HBM3",
            numa_node=0,
        )
        for i in range(count)
    ]


def agent_verdict(path: str, nvml: tuple[int, int] | None = None) -> ConfigError | None:
    """What gpu-share-plugin decides before serving (None: it would serve)."""
    try:
        cfg = load_config(["--config", path], {})
        if cfg.backend == BackendKind.DUMMY:
            devices = start_backend(cfg).devices()
        else:
            assert nvml is not None, "an nvml case needs its devices"
            devices = nvml_devices(*nvml)
        plugin_main._guard_sizes(cfg, devices)
    except ConfigError as exc:
        return exc
    return None


def validate(path: str, nvml: tuple[int, int] | None, capsys: pytest.CaptureFixture[str]
             ) -> tuple[int, str, str]:
    extra = ["--devices", str(nvml[0]), "--device-memory-mib", str(nvml[1])] if nvml else []
    rc = admin.main(["config", "validate", path, *extra])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_validate_and_agent_refuse_alike(
    case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, case.config)
    rc, out, err = validate(path, case.nvml, capsys)
    agent = agent_verdict(path, case.nvml)

    assert rc == 2 and out == ""
    assert isinstance(agent, InvalidConfigError)
    assert (case.key, case.kind) in [(p.key, p.kind) for p in agent.problems]
    # The very same text: the agent logs/prints it, validate prints it. (A described
    # NVML node is an upper bound of the real one: byte counts may differ there.)
    mask = (lambda t: re.sub(r"\d+ bytes", "N bytes", t)) if case.nvml else str
    assert mask(err) == mask(f"error: {agent.message}\n")
    assert f"key '{case.key}'" in err


def test_the_agent_process_refuses_with_the_same_message(tmp_path: Path) -> None:
    """The real ``gpu-share-plugin`` process, for a device-level case: exit 2, the same
    problem text in its log, and nothing served."""
    cfg = dummy(
        memoryUnitMiB=1024,
        stateDir=str(tmp_path / "state"),
        kubelet={"devicePluginDir": str(tmp_path / "dp"),
                 "podResourcesSocket": str(tmp_path / "pr.sock")},
        identity={"useApiServer": False},
        publish={"nodeAnnotation": False, "podAnnotation": False, "events": False},
        metrics={"enabled": False},
        logging={"format": "text"},
        dummy={"deviceCount": 2, "memoryMiB": 512,
               "faultFile": str(tmp_path / "state" / "faults.json")},
    )
    path = write(tmp_path, cfg)
    proc = subprocess.run(
        [sys.executable, "-m", "gpu_share.cli.plugin_main", "--config", path],
        capture_output=True, text=True, timeout=60, check=False,
    )
    agent = agent_verdict(path)
    assert isinstance(agent, InvalidConfigError)
    assert proc.returncode == 2
    assert agent.message in proc.stderr
    assert "reason=DeviceSmallerThanUnit" in proc.stderr
    assert not (tmp_path / "dp").exists()


@pytest.mark.parametrize("case", [c for c in CASES if c.kind == "int_type"],
                         ids=lambda c: c.name)
def test_agent_main_exits_2_with_the_same_message(
    case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, case.config)
    rc, _, err = validate(path, None, capsys)
    assert plugin_main.main(["--config", path]) == 2
    agent_err = capsys.readouterr().err
    assert rc == 2
    assert err.removeprefix("error: ") in agent_err


def test_validate_console_script_exits_2(tmp_path: Path) -> None:
    path = write(tmp_path, CASES[-3].config)  # the 300-character domain
    proc = subprocess.run(
        [sys.executable, "-m", "gpu_share.cli.admin", "config", "validate", path],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 2
    assert "key 'resources.domain'" in proc.stderr
    # Never the whole 300 characters back.
    assert "a" * 120 not in proc.stderr


@pytest.mark.parametrize(
    ("config", "nvml", "described"),
    [
        (dummy(dummy={"deviceCount": 2, "memoryMiB": 16384}), None,
         "the dummy backend's 2 devices"),
        ({"version": "v1", "memoryUnitMiB": 256}, (8, 81920), "8 devices of 81920 MiB"),
    ],
)
def test_valid_config_accepted_by_both(
    config: dict[str, object], nvml: tuple[int, int] | None, described: str,
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    path = write(tmp_path, config)
    rc, out, err = validate(path, nvml, capsys)
    assert (rc, err) == (0, "")
    assert out == f"{path}: valid (version v1); checked against {described}\n"
    assert agent_verdict(path, nvml) is None


def test_without_devices_validate_says_what_it_did_not_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, {"version": "v1", "backend": "nvml", "memoryUnitMiB": 1})
    rc, out, _ = validate(path, None, capsys)
    assert rc == 0
    assert "NOT checked against devices" in out and "--devices N --device-memory-mib" in out


@pytest.mark.parametrize(
    "args",
    [
        ["--devices", "8"],  # without its memory
        ["--device-memory-mib", "8"],
        ["--devices", "0", "--device-memory-mib", "8"],
        ["--devices", "٣", "--device-memory-mib", "8"],  # ASCII digits only
    ],
)
def test_bad_device_description_exits_2(
    args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, {"version": "v1"})
    with pytest.raises(SystemExit) as info:
        admin.main(["config", "validate", path, *args])
    assert info.value.code == 2
    capsys.readouterr()


def test_dummy_backend_refuses_a_second_device_description(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, dummy())
    rc, _, err = validate(path, (8, 81920), capsys)
    assert rc == 2 and "dummy section" in err


@pytest.mark.parametrize("count", [1, 8, 64])
def test_described_devices_bound_real_nvml_ones_on_the_wire(count: int) -> None:
    """validate's stand-in devices are at least as long on the wire as real NVML ones of
    the same count and memory (any NUMA node up to 127, any health): a description that
    passes means the real node passes."""
    def size(devices: list[Device]) -> int:
        return unit_list_size(
            lambda u, i: unit_id(u, ResourceKind.MEMORY, i),
            [(d.uuid, d.memory_mib, d.numa_node) for d in devices],
        )

    bound = size(described_devices(count, 81920))
    for numa in (None, 0, 1, 7, 127):
        real = [replace(d, numa_node=numa) for d in nvml_devices(count, 81920)]
        assert size(real) <= bound
