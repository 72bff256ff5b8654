"""The serve stage: the cell's own SGLang serving the target's architecture (stage.py), on a model made
from a real config.json with dummy weights (model.py), with the cause of a failure read from the server's
log (causes.py)."""
