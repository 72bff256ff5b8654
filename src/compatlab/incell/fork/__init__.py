"""The fork server's own side, run with the cell's interpreter: its loop (``server``) and what each child it
forks does (``child``). ``forkserver`` is its entry (``python -m compatlab.incell.forkserver``), its protocol
and its client.
"""
