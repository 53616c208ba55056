#!/usr/bin/env python3
"""Resolve a hub revision to a commit and record it in locks/model.json (`make model-lock`).

    scripts/model_lock.py [--model ID --revision REV] [--lock PATH]

Without --model: the model and the GB10 drafter at their default revisions (control/defaults.py).
Asks ${HF_ENDPOINT:-https://huggingface.co}/api/models/ID/revision/REV; a gated repo needs
HF_TOKEN in the environment (sent as a header, never printed).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from control.defaults import KNOBS  # noqa: E402
from control.model_lock import LOCK, ModelLockError, record, resolve  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--revision", default="main")
    ap.add_argument("--lock", type=Path, default=LOCK)
    a = ap.parse_args()
    wanted = (
        [(a.model, a.revision)]
        if a.model
        else [
            (KNOBS["model_id"].default, KNOBS["model_revision"].default),
            (KNOBS["drafter_model"].default, KNOBS["drafter_revision"].default),
        ]
    )
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    try:
        for model_id, revision in wanted:
            commit = resolve(endpoint, model_id, revision, os.environ.get("HF_TOKEN"))
            record(model_id, revision, commit, a.lock)
            print(f"model-lock: {model_id}@{revision} -> {commit}")
    except ModelLockError as e:
        print(f"model-lock: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
