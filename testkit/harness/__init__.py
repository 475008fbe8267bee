"""The one harness of the tests (and benchmarks) that use the real local cluster.

``hack/local-up-cluster.sh env --json`` is read once (``cluster_info``): the cluster's
environment and whether this machine can run it at all (``problem``). On top of it: the
cluster lock every user of the one local cluster takes (``cluster_lock``), kubectl/helm
runners (``Kubectl``), the cluster script itself (``run_script``, ``cluster_cmd``) and
the one poll helper (``wait_until``).
"""

from testkit.harness.env import (
    BUILD_SCRIPT,
    CLUSTER_SCRIPT,
    K8S_VERSION,
    REPO,
    UP_TIMEOUT_S,
    ClusterInfo,
    cluster_cmd,
    cluster_info,
    cluster_is_up,
    live_cluster,
    loud_skip,
    run_script,
)
from testkit.harness.kube import Kubectl, helm_path
from testkit.harness.lock import LOCK_FILE, acquire_lock, cluster_lock, lock_held, release_lock
from testkit.harness.wait import wait_until

__all__ = [
    "BUILD_SCRIPT",
    "CLUSTER_SCRIPT",
    "K8S_VERSION",
    "LOCK_FILE",
    "REPO",
    "UP_TIMEOUT_S",
    "ClusterInfo",
    "Kubectl",
    "acquire_lock",
    "cluster_cmd",
    "cluster_info",
    "cluster_is_up",
    "cluster_lock",
    "helm_path",
    "live_cluster",
    "lock_held",
    "loud_skip",
    "release_lock",
    "run_script",
    "wait_until",
]
