"""Helpers that both tests/ and bench/ import (not shipped; not under src/).

- ``testkit.harness``: the one local-cluster harness (env, lock, kubectl/helm, waits)
  and the nvidia-memory-limits node facts.
- ``testkit.kubelet_stub``, ``testkit.fake_handler``, ``testkit.host_agent``: the
  kubelet-side gRPC stub, a fake device handler, the agent as a host process.
- ``testkit.scheduler``: a gpu-share extender in process and a real kube-scheduler.
- ``testkit.e2e``: the end-to-end stories' kubectl helpers and audit.

Importable wherever the repository root is on ``sys.path``: pytest (pyproject's
``pythonpath = ["."]``) and ``python -m bench.<module>`` from the root.
"""
