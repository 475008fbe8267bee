"""Cluster-scale benchmark on the real kube-scheduler with kwok nodes:
``python -m bench.scale --nodes 1213`` (docs/scale.md)."""
