"""The node agent's DRA half: claim preparation, its checkpoint, the ResourceSlice loop
and the cleanup of what ended claims left on the host (the pure part is ``sharing.dra``).
"""
