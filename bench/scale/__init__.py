"""Cluster-scale benchmark on the real kube-scheduler with kwok nodes (issue #15):
``python -m bench.scale --nodes 1213`` (docs/scale.md)."""
