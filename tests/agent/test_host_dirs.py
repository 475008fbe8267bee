"""L2: per-container host dirs (hami-core cache) and the MemoryRequired refusal, on the
whole agent behind real gRPC servers on unix sockets (kubelet-side stub)."""

from __future__ import annotations

import os
import random
import stat
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from gpu_share.agent.hostdirs import HostDirs
from gpu_share.plugin.server import REASON_METADATA_KEY
from gpu_share.sharing.node import hami_region
from tests.agent.served_agent import CORE, MEM, Rig, hami_core_install, pod_view, rig_with


@pytest.fixture
def hami() -> Iterator[Rig]:
    runtime = {"runtime": lambda d: {"enforcement": "hami-core",
                                     "hamiCore": hami_core_install(d)}}
    with rig_with(runtime) as r:
        yield r


def _gone(rig: Rig, name: str) -> None:
    """The pod ended: the kubelet and the API server forget it; the agent reconciles."""
    rig.pods.pods.pop(("default", name))
    for key in [k for k in rig.held if k[1] == name]:
        del rig.held[key]
    rig.publish_pr()
    assert rig.agent is not None
    rig.agent.reconcile()


def test_cache_dir_is_per_pod_uid_private_and_removed_on_release(hami: Rig) -> None:
    assert hami.agent is not None
    root = hami.dir / "cache"
    assert stat.S_IMODE(root.stat().st_mode) == 0o711
    hami.admit(pod_view("p", ("main", 2, 20), uid="uid-1"), random.Random(1))
    leaf = root / "uid-1_main"
    st = leaf.lstat()
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o777
    assert st.st_uid == os.geteuid()
    # The tenant fills its dir: files, a symlink out of the root, a tree deeper than the
    # remover keeps open at once.
    secret = hami.dir / "outside.txt"
    secret.write_text("keep me")
    (leaf / "gpu-share.cache").write_bytes(b"x" * 100)
    (leaf / "escape").symlink_to(secret)
    (leaf / "escape-dir").symlink_to(hami.dir)
    deep = leaf
    for i in range(80):
        deep = deep / f"d{i}"
    deep.mkdir(parents=True)
    (deep / "f").write_text("deep")
    _gone(hami, "p")
    assert not leaf.exists()
    for _ in range(5):  # what one bounded pass left, the next ones finish
        hami.agent.reconcile()
    assert os.listdir(root) == []
    assert secret.read_text() == "keep me" and (hami.dir / "state").is_dir()
    # A later pod of the same name gets a new dir holding only its seeded region.
    hami.admit(pod_view("p", ("main", 2, 20), uid="uid-2"), random.Random(2))
    assert os.listdir(root) == ["uid-2_main"]
    assert os.listdir(root / "uid-2_main") == [hami_region.CACHE_FILE]
    seeded = hami_region.read_limits((root / "uid-2_main" / hami_region.CACHE_FILE).read_bytes())
    assert seeded is not None
    assert seeded.memory_bytes[:2] == (2 << 30, 0) and set(seeded.sm_percent) == {20}


def _refused(rig: Rig, name: str, resource: str, memory: int, cores: int) -> grpc.RpcError:
    """The kubelet admits pod ``name`` (one container) on ``resource``: its Allocate
    must fail; nothing is held for the pod, and it gets an Event."""
    assert rig.agent is not None and rig.agent.engine is not None
    rig.pods.pods[("default", name)] = pod_view(name, ("main", memory, cores),
                                                uid=f"uid-{name}")
    rig.publish_pr()
    client = rig.clients[resource]
    ids = client.preferred_allocation(rig.free_ids(resource), [], memory or cores)
    with pytest.raises(grpc.RpcError) as err:
        client.allocate(ids)
    assert rig.agent.engine.ledger.pod_entries(("default", name)) == []
    assert rig.agent.flush(5)
    return err.value


def test_a_slice_whose_cache_dir_cannot_be_made_is_not_handed_out(hami: Rig) -> None:
    """Something in the dir's place (here a file): the Allocate fails UNAVAILABLE
    (reason HostDirUnavailable), nothing is held, the pod gets an Event."""
    (hami.dir / "cache" / "uid-f_main").write_text("not a dir")
    err = _refused(hami, "f", MEM, 2, 0)
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert dict(err.trailing_metadata() or ())[REASON_METADATA_KEY] == "HostDirUnavailable"
    assert any(r == "HostDirUnavailable" and who == "default/f"
               for who, r, _ in hami.publisher.events)


def test_cores_only_shared_slice_is_refused_with_memory_required(hami: Rig) -> None:
    err = _refused(hami, "q", CORE, 0, 30)  # nothing held, an Event (below)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(err.trailing_metadata() or ())[REASON_METADATA_KEY] == "MemoryRequired"
    assert MEM in (err.details() or "")
    assert hami.agent is not None
    assert any(r == "MemoryRequired" and who == "default/q" for who, r, _ in hami.publisher.events)
    assert os.listdir(hami.dir / "cache") == []
    # The units it was offered are free again: a memory+cores pod gets them.
    hami.admit(pod_view("w", ("main", 8, 100), uid="uid-w"), random.Random(3))
    assert (hami.dir / "cache" / "uid-w_main").is_dir()


def test_host_dirs_never_follow_a_planted_symlink(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    target = tmp_path / "target"
    target.mkdir()
    dirs = HostDirs(str(root))
    dirs.ensure_root()
    target.chmod(0o700)
    (root / "uid-x_c").symlink_to(target)  # planted where a pod's dir will go
    with pytest.raises(OSError):
        dirs.create("uid-x_c")
    assert stat.S_IMODE(target.stat().st_mode) == 0o700  # not chmod-ed through the link
    assert os.listdir(target) == []
    assert dirs.trash("uid-x_c") and dirs.sweep()
    assert target.is_dir() and os.listdir(root) == []
    for bad in ("..", "../x", "a/b", ".trash-x", ""):
        with pytest.raises(ValueError):
            dirs.create(bad)


def test_follow_trashes_released_keys_and_renames_a_named_blind_entry(tmp_path: Path) -> None:
    dirs = HostDirs(str(tmp_path / "cache"))
    dirs.ensure_root()
    dirs.follow({}, initial=True)
    ids = frozenset({"GPU-0::mem::0", "GPU-0::core::0"})
    dirs.follow({"alloc-blind": ids, "uid-a_c": frozenset({"GPU-1::mem::0"})})
    dirs.create("alloc-blind")
    dirs.create("uid-a_c")
    (tmp_path / "cache" / "alloc-blind" / "f").write_text("in use")
    # Reconcile named the blind entry (same ids, new key) and released uid-a.
    dirs.follow({"uid-b_c": ids})
    assert (tmp_path / "cache" / "uid-b_c" / "f").read_text() == "in use"
    assert dirs.sweep()
    assert sorted(os.listdir(tmp_path / "cache")) == ["uid-b_c"]


def test_a_released_containers_dir_never_goes_to_the_next_holder_of_its_ids(
    tmp_path: Path,
) -> None:
    """One ledger change released pod a's container and gave its unit ids to pod b's (the
    kubelet frees a finished pod's ids at once) before b's dir was made: a's dir, with
    a's HAMi-core region (its limits and its usage), is trashed, not renamed to b's key."""
    cache = tmp_path / "cache"
    dirs = HostDirs(str(cache))
    dirs.ensure_root()
    ids = frozenset({"GPU-0::mem::0", "GPU-0::mem::1"})
    dirs.follow({"uid-a_c": ids}, initial=True)
    dirs.create("uid-a_c")
    (cache / "uid-a_c" / hami_region.CACHE_FILE).write_text("a's region")
    dirs.follow({"uid-b_c": ids})
    assert not (cache / "uid-b_c").exists()
    # A blind dir whose ids are only partly the new key's is not passed on either.
    dirs.follow({"alloc-blind": ids})
    dirs.create("alloc-blind")
    dirs.follow({"uid-c_c": frozenset({"GPU-0::mem::0"})})
    assert not (cache / "uid-c_c").exists()
    assert dirs.sweep()
    assert os.listdir(cache) == []
