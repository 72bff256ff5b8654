"""Package indexes: the simple-index client (client.py), the lock resolver built on it (lock.py), and what an
index says of one pin (probe.py).

Nothing here knows the command line, the stages, the runner or the renderers.
"""
