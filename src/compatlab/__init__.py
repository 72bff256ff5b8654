"""compatlab: which torch × sgl-kernel × flashinfer × CUDA combinations work on this box, and why not."""

from .cells import Cell, expand
from .errors import ConfigError, LabError, UsageError
from .matrix import Matrix, load_matrix, parse_matrix
from .results import SCHEMA, CellResult, StageResult

__all__ = [
    "SCHEMA",
    "Cell",
    "CellResult",
    "ConfigError",
    "LabError",
    "Matrix",
    "StageResult",
    "UsageError",
    "expand",
    "load_matrix",
    "parse_matrix",
]
__version__ = "0.1.0"
