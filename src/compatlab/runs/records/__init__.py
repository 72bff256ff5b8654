"""Typed records of what each stage found: the one place that reads and writes a stage result's details.

A stage builds its record and stores ``record.to_details()``; every reader (the other stages, the
renderers, rehearse) calls ``XDetails.of(result)``. One module per stage; like the rest of runs/, nothing
here imports anything above runs/.
"""
