"""Test helpers shared by several test packages (e.g. the kubelet stub)."""
