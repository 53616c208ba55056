"""The model downloader on a real aarch64 userland: the wheels a deploy sends it install and run there.

The GB10 box is aarch64. Its deploy stopped at the model role: the control machine sent it x86_64
wheels, which its pip refuses. The wheels are now chosen from what the host's own python3 says of
itself (roles/facts/system.py HostPython). Here that is done on a Debian 13 arm64 root
(tests/gb10/arm64_root.py: mmdebstrap, an arm64 userland whose programs qemu-user emulates, with
the amd64 build of systemd as PID 1), in the deploy's own steps:

1. the HostPython fact's command runs in the root and is parsed as the deploy parses it;
2. the model role chooses the downloader's wheels from it (roles/model.py downloader_wheels, the
   call the deploy makes), fetched from PyPI into the control machine's cache, sha256-checked;
3. the commands of the uv_installed and downloader_installed operations, planned on the root's
   facts, run in the root in their order, their uploads copied to where they go: uv (locks/tools.txt,
   its aarch64 build, chosen from the same fact), the system user, the wheelhouse, `uv venv` with
   the root's python3 (which has no ensurepip: `python3 -m venv` fails there), `uv pip install --require-hashes
   --only-binary :all: --no-index --find-links`, `import huggingface_hub`, the marker;
4. the installed downloader does its job: its native wheels load (hf_xet's Rust extension, PyYAML's
   C loader); then, the root booted, files/glm-flash-model-fetch downloads a small repo from a fake
   hub on loopback (sandbox/fake_hub.py) with that venv's python in the deploy's own download unit
   (download_unit_text: the unit file, the downloader's user, the unit's sandbox), started by
   `glm-flash-job start`, followed by `glm-flash-job follow` and checked as its owner (the tool
   drops to that user through setpriv), as the deploy runs it;
5. the broken case, what was sent before (the same lock's files chosen for x86_64): the host's uv
   refuses them for the downloader's python (a resolution, `--dry-run`).

What differs from the box: Debian 13 is not DGX OS. Its python3 is 3.13 where DGX OS's is 3.12, and
its glibc is 2.41 where DGX OS's is 2.39. So what installs here are the cp313 aarch64 wheels this
root's python3 asks for, chosen by the same code from the same fact. The cp312 aarch64 wheels DGX
OS's python3 gets are checked by tests/unit/test_wheel_target.py (the GB10 plan, and pip's own
resolution for that platform). Nothing aarch64 runs natively here: qemu emulates it, which is slow,
so only the downloader's own steps run emulated. The arm64 root is built once and cached.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import sys
from pathlib import Path

import pytest
from pyinfra.api import FileUploadCommand, StringCommand
from pyinfra.facts.files import File

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "tests" / "unit"))
sys.path.insert(0, str(REPO))

import arm64_root  # noqa: E402
from fakehost import F, FakeHost, on  # noqa: E402

from control import layout  # noqa: E402
from control.engine_lock import Target  # noqa: E402
from roles import model  # noqa: E402
from roles.facts.accounts import Account  # noqa: E402
from roles.facts.model import DownloaderMarker, check_as_owner  # noqa: E402
from roles.facts.system import HostPython  # noqa: E402
from roles.operations import checkpoint, python  # noqa: E402
from sandbox.fake_hub import FakeHub  # noqa: E402

REQUIREMENTS = (REPO / "files" / "hf-hub-requirements.txt").read_text()
VENV = "/opt/glm-flash/tools/hf-hub"  # the profile's default (layout.hub_venv)
UV = "/opt/glm-flash/tools/uv"  # (layout.host_uv)
USER = "glm-flash-fetch"
FETCH = REPO / "files" / "glm-flash-model-fetch"
REPO_ID = "zai-org/GLM-5.3-Flash"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    try:
        arm64_root.emulation()
        base = tmp_path_factory.mktemp("arm64")
        yield arm64_root.unpacked(base / "root")
    except arm64_root.Unavailable as e:
        pytest.fail(f"no aarch64 userland here: {e}")
    shutil.rmtree(base / "root", ignore_errors=True)


def sh(root: Path, command: str, **kw):
    r = arm64_root.run(root, command, **kw)
    assert r.returncode == 0, f"{command}\n{r.stdout}\n{r.stderr}"
    return r


def host_python(root: Path) -> dict | None:
    """The HostPython fact, its own command run in the root, parsed as pyinfra would."""
    command = HostPython().command().get_raw_value()
    return HostPython().process(sh(root, command).stdout.splitlines())


def planned(root: Path, found: dict, wheels_for) -> list:
    """The uv_installed and downloader_installed operations' commands on this root's facts (a fresh host)."""
    facts = {
        F(Account, user=USER): None,
        F(DownloaderMarker, marker=f"{VENV}/.glm-flash-requirements.sha256"): "",
        F(File, path=UV): None,
        HostPython: found,
    }
    with on(FakeHost(facts, name="arm64")):
        return [
            *python.uv_installed._inner(dest=UV),
            *checkpoint.downloader_installed._inner(
                venv=VENV, requirements=REQUIREMENTS, wheels_for=wheels_for, user=USER, uv=UV
            ),
        ]


def carried_out(root: Path, commands: list) -> list[str]:
    """Each command run in the root in order; an upload copied to its place (what pyinfra's put does)."""
    uploaded = []
    for c in commands:
        if isinstance(c, FileUploadCommand):
            dest = root / c.dest.lstrip("/")
            data = c.src.getvalue() if isinstance(c.src, io.BytesIO) else Path(c.src).read_bytes()
            dest.write_bytes(data)
            uploaded.append(c.dest)
        else:
            assert isinstance(c, StringCommand), c
            sh(root, c.get_raw_value())
    return uploaded


def test_the_downloader_installs_and_runs_on_aarch64_from_the_wheels_chosen_for_it(root, tmp_path):
    found = host_python(root)
    assert found == {
        "implementation": "cpython",
        "version": "3.13",  # Debian 13's; DGX OS's is 3.12 (tests/unit/test_wheel_target.py)
        "platform": "linux-aarch64",
        "libc": "glibc 2.41",
        "bits": 64,
    }
    target = Target.of_interpreter(found)
    chosen = []

    def wheels_for(f):
        chosen[:] = model.downloader_wheels(REQUIREMENTS, f)
        return chosen

    commands = planned(root, found, wheels_for)
    assert chosen and all(Path(w).parent.name == target.name for w in chosen)
    assert any(Path(w).name.startswith("hf_xet-") and Path(w).name.endswith("_aarch64.whl") for w in chosen)
    assert any("-cp313-cp313-" in Path(w).name and Path(w).name.endswith("_aarch64.whl") for w in chosen)
    assert not any("x86_64" in Path(w).name for w in chosen)
    uploaded = carried_out(root, commands)
    assert sorted(Path(u).name for u in uploaded) == sorted(
        [".uv.glm-flash-new", "hf-hub.requirements.txt", *(Path(w).name for w in chosen)]
    )
    # what the old way needed is not there: Debian's python3 without python3-venv makes no venv itself
    r = arm64_root.run(root, "python3 -m venv /srv/probe")
    assert r.returncode != 0 and "ensurepip is not" in r.stdout + r.stderr, r.stdout + r.stderr
    assert not (root / VENV.lstrip("/") / "bin/pip").exists()  # nothing left that installs
    marker = (root / VENV.lstrip("/") / ".glm-flash-requirements.sha256").read_text().strip()
    assert marker == hashlib.sha256(REQUIREMENTS.encode()).hexdigest()
    assert not (root / (VENV + ".wheels").lstrip("/")).exists()  # removed once installed

    # The native parts are aarch64 code that loads, and the downloader downloads.
    python = f"{VENV}/bin/python"
    r = sh(root, f"{python} -c 'import platform, hf_xet, yaml; yaml.CSafeLoader; print(platform.machine())'")
    assert r.stdout.strip() == "aarch64"
    shard = "model-00001-of-00001.safetensors"
    index = {"metadata": {"total_size": 16384}, "weight_map": {"w0": shard}}
    files = {"config.json": b'{"architectures": ["Glm5NextForConditionalGeneration"]}', shard: bytes(range(256)) * 64}
    files["model.safetensors.index.json"] = json.dumps(index).encode()
    shutil.copy(FETCH, root / "usr/local/bin/glm-flash-model-fetch")
    shutil.copy(FETCH.parent / "glm-flash-job", root / "usr/local/bin/glm-flash-job")
    # the deploy installs the host tools' shared module beside each tool (roles/operations/uploads.py)
    shutil.copy(FETCH.parent / layout.HOST_MODULE, root / "usr/local/bin" / layout.HOST_MODULE)
    # The download as the deploy runs it: the root booted, the download's unit file (its user,
    # properties, sandbox and restart backoff: roles/operations/checkpoint.py download_unit_text)
    # started, and followed by glm-flash-job as the deploy follows it.
    unit, tool = "glm-flash-model-download", "/usr/local/bin/glm-flash-model-fetch"
    with FakeHub(REPO_ID, files) as hub, arm64_root.booted(root) as machine:
        args = ["download", "--dest", "/srv/model", "--repo", REPO_ID, "--revision", hub.commit]
        text = checkpoint.download_unit_text(USER, [python, tool, *args], "/srv/model", hub.endpoint, None, REPO_ID)
        (root / f"etc/systemd/system/{unit}.service").write_text(text)
        # started, followed and checked by the deploy's own commands (the check drops to the owner)
        checked = check_as_owner(tool, "/srv/model", REPO_ID, hub.commit).get_raw_value()
        r = machine.sh(
            f"install -d -m 755 -o {USER} -g {USER} /srv/model && systemctl daemon-reload"
            f" && python3 /usr/local/bin/glm-flash-job start {unit}.service"
            f" && python3 /usr/local/bin/glm-flash-job follow {unit}.service && {checked}"
        )
        assert r.returncode == 0, r.stdout + r.stderr
        assert len(hub.downloads()) == len(files)
        # it ran as that unit (its journal), on a userland that calls itself aarch64
        said = machine.sh(f"journalctl --sync; journalctl -u {unit} -o cat --no-pager").stdout
        assert f"verified {len(files)} files of {REPO_ID}@{hub.commit}" in said, said
        assert machine.sh("uname -m; dpkg --print-architecture").stdout.split() == ["aarch64", "arm64"]
    # written by the downloader's user (User= of the unit), byte for byte the hub's
    uid = next(
        int(line.split(":")[2])
        for line in (root / "etc/passwd").read_text().splitlines()
        if line.startswith(USER + ":")
    )
    for name, data in files.items():
        assert (root / "srv/model" / name).read_bytes() == data
        assert (root / "srv/model" / name).stat().st_uid == uid, name
    assert json.loads((root / "srv/model/.glm-flash-model.json").read_text())["commit"] == hub.commit

    # The broken case: the same lock's files chosen for x86_64 (what every host got before), which
    # the host's uv refuses for the downloader's python. A resolution only (--dry-run).
    x86 = {**found, "platform": "linux-x86_64"}
    with on(FakeHost({}, name="arm64")):
        wheels = model.downloader_wheels(REQUIREMENTS, x86)
    house = root / "srv/x86-wheels"  # not /tmp: systemd-nspawn mounts a fresh tmpfs there
    house.mkdir(parents=True)
    for w in wheels:
        shutil.copy(w, house / Path(w).name)
    (root / "srv/req.txt").write_text(REQUIREMENTS)
    r = arm64_root.run(
        root,
        f"{UV} pip install --dry-run --reinstall --no-config --offline --no-cache --python {VENV}/bin/python "
        "--no-deps --require-hashes --only-binary :all: --no-index --find-links /srv/x86-wheels -r /srv/req.txt",
    )
    assert r.returncode != 0
    # uv names the wheel it cannot use and why: e.g. "hf-xet==1.8.0 has no wheels with a matching
    # platform tag (e.g., `manylinux_2_41_aarch64`)"
    assert "has no wheels with a matching platform tag" in r.stderr, r.stderr
    assert ("hf-xet" in r.stderr or "pyyaml" in r.stderr) and "aarch64" in r.stderr, r.stderr
