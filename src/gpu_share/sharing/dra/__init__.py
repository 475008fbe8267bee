"""DRA (pure): ResourceClaims read as device shares, the node's ResourceSlice, a claim's
CDI spec, and the webhook's translation of extended-resource requests into claims.

Above ``sharing.node`` and ``sharing.placement`` (it may use both; neither uses it).
"""
