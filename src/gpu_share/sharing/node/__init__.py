"""The node agent's allocation core (pure): the engine, its ledger and the device choice.

Shared value types and wire formats are one level up (``gpu_share.sharing``); this
package imports neither ``sharing.placement`` nor ``sharing.dra``.
"""
