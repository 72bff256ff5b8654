"""The results contract: the model of cells and stages, and the store, the only reader and writer of a run folder."""
