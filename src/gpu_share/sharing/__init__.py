"""The allocation core (pure: no I/O, no clock), one folder per subsystem.

``node`` is the node agent's allocation core, ``placement`` the cluster placement (the
extender's and the trace replay's), ``dra`` the DRA mode's claims and slices. The modules
at this level are the value types and wire formats more than one of them uses; they
import no subsystem (docs/architecture.md has the layout, pyproject.toml the contract).
"""
