#!/usr/bin/env python3
"""Write docs/knobs.md from control/defaults.py (`make knobs-doc`); see control/knob_reference.py."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from control.knob_reference import render  # noqa: E402

target = REPO / "docs" / "knobs.md"
target.write_text(render())
print(f"wrote {target.relative_to(REPO)}")
