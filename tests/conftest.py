"""Plugins every test directory shares."""

# The local cluster's lifecycle: one lock, one up, one down per session.
pytest_plugins = ["testkit.pytest_cluster"]
