"""Code that runs with the cell's interpreter: the standard library and this package only.

Nothing here may import anything outside ``compatlab.incell`` (a test enforces it), because a cell's venv
has only the cell's packages; the lab puts this package alone on the cell's ``PYTHONPATH``."""
