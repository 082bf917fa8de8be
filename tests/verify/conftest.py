"""The verifier's own tests: the examples (imported as ``examples.*`` from the repository
root) and small scenarios in ``verify_scenarios.py``, some of them broken on purpose."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
