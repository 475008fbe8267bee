"""Admission front-end: the mutating webhook that turns vcuda limits into ResourceClaims."""
