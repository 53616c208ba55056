"""The model lock: a moving hub revision (`main`) resolved once to a commit, kept beside the inventory.

Where it is (lock_path): an inventory of the operator's own (inventory/local/, which git
ignores, or a directory outside the clone) keeps its lock beside it as `model-lock.json`, so a
`git pull` of the repo never meets an edited tracked file; the repo's own inventories
(inventory/*.py: the examples, the sandbox) use locks/model.json.

Re-runs and other hosts then serve the same commit until `make model-lock` is run on purpose.
A revision that already is a commit (40 hex digits) needs no entry. Control machine only.

As cargo and uv do with a missing lock entry, the first real deploy of a moving revision asks
the hub once (resolve), writes the entry (record: a temp file beside the lock, synced,
renamed) and says so, asking the user to commit it; `--dry` resolves and writes nothing. An
existing entry is never changed by a deploy, only by `make model-lock`.

    {"zai-org/GLM-5.3-Flash": {"main": "<40 hex>"}, ...}
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from control import layout

LOCK = layout.LOCKS / "model.json"  # the repo's own inventories'
BESIDE = "model-lock.json"  # an operator's inventory's, in its directory
COMMIT = re.compile(r"[0-9a-f]{40}")
_inventory: Path | None = None


def inventory_is(path: str | Path) -> None:
    """The inventory file pyinfra is loading (control.profile.check_inventory() says so): its lock is beside it."""
    global _inventory
    _inventory = Path(path).resolve()


def lock_path(inventory: Path | None = None) -> Path:
    where = inventory or _inventory
    if where is None or where.parent == (layout.REPO / "inventory").resolve():
        return LOCK
    return where.parent / BESIDE


def shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(layout.REPO))
    except ValueError:
        return str(path)


class ModelLockError(Exception):
    pass


def load(path: Path | None = None) -> dict[str, dict[str, str]]:
    path = path or lock_path()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except ValueError as e:
        raise ModelLockError(f"{path.name} is not valid JSON ({e}); regenerate it with `make model-lock`") from None
    return data if isinstance(data, dict) else {}


def commit_for(model_id: str, revision: str, path: Path | None = None) -> str:
    """The commit a deploy serves for model_id at revision."""
    path = path or lock_path()
    if COMMIT.fullmatch(revision):
        return revision
    commit = (load(path).get(model_id) or {}).get(revision)
    if not commit or not COMMIT.fullmatch(commit):
        raise ModelLockError(
            f"{model_id}@{revision} is not locked to a commit in {shown(path)}: run "
            f"`make model-lock MODEL={model_id} REVISION={revision} LOCK={shown(path)}` (asks the hub once "
            f"and records the commit there), or set the revision to a commit"
        )
    return commit


def record(model_id: str, revision: str, commit: str, path: Path | None = None) -> None:
    """Write `model_id`@`revision` -> `commit` into the lock, atomically (a kill leaves the old file)."""
    path = path or lock_path()
    if not COMMIT.fullmatch(commit):
        raise ModelLockError(f"the hub answered {commit!r} for {model_id}@{revision}, not a commit")
    data = load(path)
    data.setdefault(model_id, {})[revision] = commit
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def origin(url: str) -> tuple[str, str, int | None]:
    u = urllib.parse.urlsplit(url)
    return u.scheme, (u.hostname or "").lower(), u.port or {"http": 80, "https": 443}.get(u.scheme)


class _TokenStaysHome(urllib.request.HTTPRedirectHandler):
    """Follows the hub's redirects, the token only to the origin it was given for: urllib copies a
    Request's headers onto any redirect target, another host included (huggingface_hub drops it
    across origins too)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        token = req.unredirected_hdrs.get("Authorization")
        if new is not None and token and origin(newurl) == origin(req.full_url):
            new.add_unredirected_header("Authorization", token)
        return new


def resolve(endpoint: str, model_id: str, revision: str, token: str | None) -> str:
    """The commit the hub at `endpoint` names for `model_id`@`revision` (its model-info API)."""
    url = f"{endpoint.rstrip('/')}/api/models/{model_id}/revision/{urllib.parse.quote(revision, safe='')}"
    req = urllib.request.Request(url)
    if token:
        req.add_unredirected_header("Authorization", f"Bearer {token}")  # not copied by urllib's redirect
    try:
        with urllib.request.build_opener(_TokenStaysHome).open(req, timeout=60) as r:
            commit = json.load(r)["sha"]
    except urllib.error.HTTPError as e:
        raise ModelLockError(f"{url}: the hub answered {e.code} (gated or private: set HF_TOKEN)") from None
    except (urllib.error.URLError, OSError) as e:
        raise ModelLockError(f"{url}: cannot reach the hub ({getattr(e, 'reason', e)})") from None
    except (ValueError, KeyError, TypeError):
        raise ModelLockError(f"{url}: the answer has no commit (sha)") from None
    if not isinstance(commit, str) or not COMMIT.fullmatch(commit):
        raise ModelLockError(f"the hub answered {commit!r} for {model_id}@{revision}, not a commit")
    return commit
