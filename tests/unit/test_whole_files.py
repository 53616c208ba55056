"""Files the deploy owns are written whole or not at all (roles/operations/paths.py): new content
goes to a dot-named temporary file in the same directory, gets its owner and mode there, is synced
and renamed over the destination; a file already right is left alone; owner or mode alone is fixed
in place. Nothing the deploy puts is uploaded straight onto its final path."""

from __future__ import annotations

import ast
import io
from pathlib import Path
from types import SimpleNamespace

from pyinfra.api import FileUploadCommand
from pyinfra.api.util import get_file_sha1
from pyinfra.facts.files import Directory, File, Sha1File

from roles.operations import paths
from tests.unit.fakehost import F, FakeHost, on, render

REPO = Path(__file__).resolve().parents[2]
DEST = "/etc/systemd/system/glm-flash.service"
TMP = "/etc/systemd/system/.glm-flash.service.glm-flash-new"
BODY = "[Unit]\nDescription=GLM\n"


def facts(content: str | None, user="root", group="root", mode=644) -> dict:
    info = None if content is None else {"user": user, "group": group, "mode": mode}
    return {
        F(File, path=DEST): info,
        F(Sha1File, path=DEST): None if content is None else get_file_sha1(io.StringIO(content)),
        F(Directory, path="/etc/systemd/system"): {"user": "root", "group": "root", "mode": 755},
    }


def put(host_facts: dict, **kw) -> tuple[list, FakeHost]:
    fake = FakeHost(host_facts)
    fake.state.config = SimpleNamespace(DIFF=False)
    kw = {"user": "root", "group": "root", "mode": "644", **kw}
    with on(fake):
        return list(paths._put._inner(src=io.StringIO(BODY), dest=DEST, **kw)), fake


WHOLE = [
    "mkdir -p /etc/systemd/system",
    f"rm -f {TMP}",
    f"upload {TMP}\n{BODY}",
    f"chown root:root {TMP}",
    f"chmod 644 {TMP}",
    f"sync {TMP} && mv -f -T {TMP} {DEST} && sync /etc/systemd/system",
]


def test_new_or_changed_content_goes_through_a_synced_temporary_file_and_a_rename():
    for before in (None, "[Unit]\nDescription=old\n", ""):  # absent, drifted, truncated by an earlier kill
        cmds, _ = put(facts(before))
        assert [render(c) for c in cmds] == WHOLE
        uploads = [c for c in cmds if isinstance(c, FileUploadCommand)]
        assert [u.dest for u in uploads] == [TMP], "never uploaded onto the destination itself"


def test_the_temporary_name_is_one_no_reader_of_the_directory_takes():
    for dest in (DEST, "/etc/apt/sources.list.d/debian.sources", "/etc/apt/preferences.d/glm-flash-nvidia-driver"):
        name = paths.staging_name(dest).rsplit("/", 1)[1]
        assert name.startswith(".") and name.endswith(".glm-flash-new")
        assert paths.staging_name(dest).rsplit("/", 1)[0] == dest.rsplit("/", 1)[0], "same filesystem: same directory"


def test_a_file_already_right_is_left_alone():
    cmds, fake = put(facts(BODY))
    assert cmds == [] and fake.noops == [f"file {DEST} is already uploaded"]


def test_owner_or_mode_alone_is_fixed_in_place_without_rewriting_the_content():
    cmds, _ = put(facts(BODY, mode=600))
    assert [render(c) for c in cmds] == [f"chmod 644 {DEST}"]
    cmds, _ = put(facts(BODY, user="glm-flash"))
    assert [render(c) for c in cmds] == [f"chown root:root {DEST}"]


def test_owner_and_mode_left_open_are_a_new_files_never_the_old_files():
    cmds, _ = put(facts("old"), user=None, group=None, mode=None)
    assert [render(c) for c in cmds] == [c for c in WHOLE if not c.startswith(("chown", "chmod"))]


def test_a_destination_with_spaces_or_quotes_reaches_the_shell_quoted():
    fake = FakeHost({})
    with on(fake):
        cmds = [render(c) for c in paths.replaced_whole(io.StringIO("x"), "/srv/my dir/it's.json", mode="644")]
    assert cmds[-1] == (
        "sync '/srv/my dir/.it'\"'\"'s.json.glm-flash-new' && mv -f -T '/srv/my dir/.it'\"'\"'s.json.glm-flash-new' "
        "'/srv/my dir/it'\"'\"'s.json' && sync '/srv/my dir'"
    )


# Uploads that are not files the deploy owns: build inputs in root-only staging directories that
# the same operation consumes and removes (a truncated one fails the build's hash check or is sized
# again by its fact), and the secrets, which stage and rename on their own (roles/operations/secrets.py).
UPLOADS_ALLOWED = {
    "roles/operations/paths.py": "the one writer of owned files: to the temporary name only",
    "roles/operations/secrets.py": "staged root-only, synced, renamed",
    "roles/operations/engine.py": "wheels into the wheelhouse, sized by WheelhouseFiles before reuse",
    "roles/operations/checkpoint.py": "the downloader's requirements and wheels, removed after its venv is built",
    "roles/operations/python.py": "the Python archive, unpacked and removed by the same operation",
}


def test_no_module_uploads_a_file_straight_to_where_it_is_read():
    found = {}
    for path in sorted(
        [*REPO.glob("roles/**/*.py"), *REPO.glob("control/*.py"), *REPO.glob("pyinfra_ext/*.py"), REPO / "deploy.py"]
    ):
        rel = str(path.relative_to(REPO))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "files":
                if node.attr in ("put", "template", "line", "replace", "block", "sync", "copy") and rel not in (
                    "roles/operations/paths.py",
                    "roles/operations/python.py",
                ):
                    found.setdefault(rel, []).append(f"files.{node.attr}")
            if isinstance(node, ast.Name) and node.id == "FileUploadCommand" and rel not in UPLOADS_ALLOWED:
                found.setdefault(rel, []).append("FileUploadCommand")
    assert found == {}, "write owned files with roles/operations/paths.py (put/template) or uploads.py"
