"""gpu-share: split GPUs (or dummy NPUs) into memory units and core percent for Kubernetes."""

__version__ = "0.1.0"
