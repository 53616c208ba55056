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
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from control import layout
from control.pypi_cache import write_whole

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
    write_whole(path, json.dumps(data, indent=2, sort_keys=True) + "\n", 0o644, sync=True)


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


def _hub_json(url: str, token: str | None, what: str):
    """The hub's JSON answer at `url`, the token sent to the hub's own origin only."""
    req = urllib.request.Request(url)
    if token:
        req.add_unredirected_header("Authorization", f"Bearer {token}")  # not copied by urllib's redirect
    try:
        with urllib.request.build_opener(_TokenStaysHome).open(req, timeout=60) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        raise ModelLockError(f"{url}: the hub answered {e.code} (gated or private: set HF_TOKEN)") from None
    except (urllib.error.URLError, OSError) as e:
        raise ModelLockError(f"{url}: cannot reach the hub ({getattr(e, 'reason', e)})") from None
    except ValueError:
        raise ModelLockError(f"{url}: the answer is not {what}") from None


def resolve(endpoint: str, model_id: str, revision: str, token: str | None) -> str:
    """The commit the hub at `endpoint` names for `model_id`@`revision` (its model-info API)."""
    url = f"{endpoint.rstrip('/')}/api/models/{model_id}/revision/{urllib.parse.quote(revision, safe='')}"
    try:
        commit = _hub_json(url, token, "JSON")["sha"]
    except (KeyError, TypeError):
        raise ModelLockError(f"{url}: the answer has no commit (sha)") from None
    if not isinstance(commit, str) or not COMMIT.fullmatch(commit):
        raise ModelLockError(f"the hub answered {commit!r} for {model_id}@{revision}, not a commit")
    return commit


BLOB = re.compile(r"[0-9a-f]{40}")
SHA256 = re.compile(r"[0-9a-f]{64}")


def hub_files(endpoint: str, model_id: str, commit: str, token: str | None) -> dict[str, dict]:
    """The hub's own list of `model_id`'s files at `commit` (its model-info API with blobs):
    {name: {"size", "blob_id", "sha256"}}, sha256 for the large (LFS) files, None for the others,
    which the hub names by their git blob id only."""
    if not COMMIT.fullmatch(commit):
        raise ModelLockError(f"{commit!r} is not a commit")
    url = f"{endpoint.rstrip('/')}/api/models/{model_id}/revision/{commit}?blobs=true"
    info = _hub_json(url, token, "JSON")
    if not isinstance(info, dict):
        raise ModelLockError(f"{url}: the answer is not the hub's model info")
    out = {}
    for s in info.get("siblings") or []:
        s = s if isinstance(s, dict) else {}
        lfs = s.get("lfs")
        name = s.get("rfilename")
        entry = {
            "size": s.get("size"),
            "blob_id": s.get("blobId"),
            "sha256": lfs.get("sha256") if isinstance(lfs, dict) else None,
        }
        if (
            not isinstance(name, str)
            or not isinstance(entry["size"], int)
            or not BLOB.fullmatch(str(entry["blob_id"]))
            or (lfs is not None and not (isinstance(lfs, dict) and SHA256.fullmatch(str(entry["sha256"]))))
        ):
            raise ModelLockError(f"{url}: a file entry without a name, size, blob id or LFS sha256: {s!r:.200}")
        out[name] = entry
    if info.get("sha") != commit or not out:
        raise ModelLockError(f"{url}: the answer is not the file list of {model_id}@{commit}")
    return out


def checked_by_hub(marker_text: str, files: dict[str, dict], model_id: str, commit: str) -> str:
    """The marker the fleet's receivers check their copies against: the seed's marker (its files'
    names and the sha256 it verified) held against the hub's own list at the locked commit
    (hub_files). Every entry's size, blob id and LFS flag, and a large file's sha256, must be the
    hub's; a small file's sha256 stays the seed's, and the receivers check its git blob id (the
    hub's) as well. A seed that altered a file and its marker is refused here, naming the file,
    before anything reaches a receiver. Raises ModelLockError."""
    try:
        marker = json.loads(marker_text)
        names = marker["files"]
    except (ValueError, KeyError, TypeError):
        raise ModelLockError("the seed's marker is not JSON with a file list") from None
    if not isinstance(names, dict) or marker.get("repo") != model_id or marker.get("commit") != commit:
        raise ModelLockError(f"the seed's marker is not {model_id}@{commit}'s")
    missing = sorted(set(files) - set(names))
    if missing:
        raise ModelLockError(f"{missing[0]}: the hub has it at {commit} and the seed's marker does not")
    out = {}
    for name, e in sorted(names.items()):
        hub = files.get(name)
        if hub is None:
            raise ModelLockError(f"{name}: the seed lists a file the hub does not have at {commit}")
        lfs = hub["sha256"] is not None
        if not isinstance(e, dict) or e.get("size") != hub["size"] or e.get("blob_id") != hub["blob_id"]:
            raise ModelLockError(f"{name}: the seed's size or blob id is not the hub's at {commit}")
        if bool(e.get("lfs")) != lfs or (lfs and e.get("sha256") != hub["sha256"]):
            raise ModelLockError(f"{name}: the seed's sha256 is not the hub's at {commit}")
        if not SHA256.fullmatch(str(e.get("sha256"))):
            raise ModelLockError(f"{name}: the seed's entry has no sha256")
        out[name] = {"lfs": lfs, "size": hub["size"], "blob_id": hub["blob_id"], "sha256": e["sha256"]}
    return json.dumps(dict(marker, files=out, checked_by="the control machine, against the hub's file list"))
