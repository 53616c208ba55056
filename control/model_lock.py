"""locks/model.json: a moving hub revision (`main`) resolved once to a commit, kept in the repo.

Re-runs and other hosts then serve the same commit until `make model-lock` is run on purpose.
A revision that already is a commit (40 hex digits) needs no entry. Control machine only.

    {"zai-org/GLM-5.3-Flash": {"main": "<40 hex>"}, ...}
"""

from __future__ import annotations

import json
import re
from pathlib import Path

LOCK = Path(__file__).resolve().parent.parent / "locks" / "model.json"
COMMIT = re.compile(r"[0-9a-f]{40}")


class ModelLockError(Exception):
    pass


def load(path: Path | None = None) -> dict[str, dict[str, str]]:
    path = path or LOCK
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except ValueError as e:
        raise ModelLockError(f"{path.name} is not valid JSON ({e}); regenerate it with `make model-lock`") from None
    return data if isinstance(data, dict) else {}


def commit_for(model_id: str, revision: str, path: Path | None = None) -> str:
    """The commit a deploy serves for model_id at revision."""
    path = path or LOCK
    if COMMIT.fullmatch(revision):
        return revision
    commit = (load(path).get(model_id) or {}).get(revision)
    if not commit or not COMMIT.fullmatch(commit):
        raise ModelLockError(
            f"{model_id}@{revision} is not locked to a commit in locks/{path.name}: run "
            f"`make model-lock MODEL={model_id} REVISION={revision}` (asks the hub once and records the "
            f"commit in the repo), or set the revision to a commit"
        )
    return commit


def record(model_id: str, revision: str, commit: str, path: Path | None = None) -> None:
    path = path or LOCK
    if not COMMIT.fullmatch(commit):
        raise ModelLockError(f"the hub answered {commit!r} for {model_id}@{revision}, not a commit")
    data = load(path)
    data.setdefault(model_id, {})[revision] = commit
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
