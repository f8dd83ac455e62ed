import sys
from pathlib import Path

# Test helpers (fakes.py, live.py) are imported by name.
sys.path.insert(0, str(Path(__file__).parent))
