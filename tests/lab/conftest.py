import sys
from pathlib import Path

# The lab's tests import their helpers (_wheels) by name.
sys.path.insert(0, str(Path(__file__).parent))
