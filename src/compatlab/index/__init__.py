"""Package indexes: the simple-index client (client.py) and the lock resolver built on it (lock.py).

Nothing here knows the command line, the stages, the runner or the renderers.
"""
