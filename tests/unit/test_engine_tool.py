"""files/glm-flash-engine on a scratch install root: real offline builds from real PyPI wheels
(three small pins copied verbatim from the 0.7.0.post1 lock, fetched into the cache once),
a build that fails its hash check, switch, rollback, prune, a pin put back.
The engine's own packages are built in the sandbox suite; this covers the mechanics fast."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from control.engine_lock import Pin, fetch, load_lock, lock_json, tools_bin
from roles.facts.engine import EngineEnvs

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "files" / "glm-flash-engine"
NAMES = ("idna", "sniffio", "annotated-types")


def base_python() -> str:
    exe = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    return str(exe)


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    """A lock of three real pins and a wheelhouse holding their real wheels."""
    _, pins = load_lock("0.7.0.post1")
    chosen = [p for p in pins if p.name in NAMES]
    d = tmp_path_factory.mktemp("mini")
    wheelhouse = d / "wheelhouse"
    wheelhouse.mkdir()
    for path in fetch(chosen, log=lambda *_: None):
        os.link(
            path, wheelhouse / path.name
        ) if path.stat().st_dev == wheelhouse.stat().st_dev else wheelhouse.joinpath(path.name).write_bytes(
            path.read_bytes()
        )
    # the locks as the deploy uploads them: JSON written by control/engine_lock.py
    lock2 = d / "two.json"
    lock2.write_text(lock_json(chosen[:2]))
    lock3 = d / "three.json"
    lock3.write_text(lock_json(chosen))
    bad = d / "bad.json"
    first = chosen[0]
    bad.write_text(lock_json([Pin(first.name, first.version, ("0" * 64,))]))
    return {"pins": chosen, "wheelhouse": wheelhouse, "lock2": lock2, "lock3": lock3, "bad": bad}


# The tool run with its wall clock moved on by `ahead_s`: time.time_ns() is the only clock it
# reads (its 2 s quiet window for the owner-check record). os.utime cannot stand in: it sets a
# file's ctime to now, and the window looks at ctime too.
AHEAD = """
import os, runpy, sys, time
real, ahead = time.time_ns, int(float(sys.argv.pop(1)) * 1e9)
time.time_ns = lambda: real() + ahead
sys.argv.pop(0)
sys.path[0] = os.path.dirname(os.path.realpath(sys.argv[0]))  # as for a script: its own directory first
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def tool(
    root: Path, *args: str, check: bool = True, ahead_s: float = 0.0, jail: list[str] | None = None
) -> subprocess.CompletedProcess:
    """glm-flash-engine ARGS with its paths under `root`; `jail`: bwrap's arguments to run it in."""
    uv = root / "tools" / "uv"  # where the deploy puts the pinned uv: the tool's default
    if not uv.exists():
        uv.parent.mkdir(parents=True, exist_ok=True)
        uv.symlink_to(tools_bin() / "uv")  # the control machine's: the same pin (locks/tools.txt)
    home = root.parent / "home-is-a-file"  # the job's ProtectHome: nothing may be written under HOME
    home.touch()
    env = dict(
        {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "UV_"))},
        HOME=str(home),
        GLM_FLASH_ROOT=str(root),
        GLM_FLASH_STATE_DIR=str(root / "patch-state"),
        GLM_FLASH_CHECK_DIR=str(root / "state" / "engine-checks"),
        GLM_FLASH_CONF_DIR=str(root / "conf"),
    )
    argv = (
        [sys.executable, "-c", AHEAD, str(ahead_s), str(TOOL), *args] if ahead_s else [sys.executable, str(TOOL), *args]
    )
    if jail:
        argv = ["bwrap", "--die-with-parent", *jail, *argv]
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    if check and r.returncode:
        raise AssertionError(f"glm-flash-engine {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


def status(root: Path) -> dict:
    return json.loads(tool(root, "status", "--json").stdout)


def build(root: Path, env: str, lock: Path, wheelhouse: Path, check: bool = True):
    return tool(
        root, "build", env, "--python", base_python(), "--lock", str(lock), "--wheelhouse", str(wheelhouse), check=check
    )


def test_build_switch_rollback_prune(tmp_path, mini):
    root = tmp_path / "root"
    a, b, c = "0.7.0.post1-aaaaaaaaaaaa", "0.7.0.post4-bbbbbbbbbbbb", "0.7.2-cccccccccccc"
    build(root, a, mini["lock2"], mini["wheelhouse"])
    marker = root / "engine/envs" / a / ".glm-flash-complete"
    assert json.loads(marker.read_text())["packages"] == 2
    stamp = marker.stat().st_mtime_ns
    assert "already complete" in build(root, a, mini["lock2"], mini["wheelhouse"]).stdout
    assert marker.stat().st_mtime_ns == stamp  # second build: nothing done

    assert status(root)["current"] is None
    tool(root, "switch", a)
    assert status(root)["current"] == a and (root / "engine/current").resolve() == root / "engine/envs" / a
    # what the deploy's fact makes of the tool's answer
    state = EngineEnvs.parse(tool(root, "status", "--json").stdout.splitlines())
    assert state.current == a and state.complete == (a,)
    assert state.version(a, "idna") == mini["pins"][[p.name for p in mini["pins"]].index("idna")].version
    assert state.owner_ok(a) is None  # no transformers-kt in this environment

    # a wheel that does not match the lock's hash: the build fails, nothing switches to it
    r = build(root, b, mini["bad"], mini["wheelhouse"], check=False)
    assert r.returncode == 2 and "uv pip install failed" in r.stderr and "Hash mismatch" in r.stderr, r.stderr
    assert tool(root, "switch", b, check=False).returncode == 2
    assert status(root)["current"] == a and status(root)["envs"][b] == "incomplete"

    # the same env name built again from a good lock replaces the half-built one
    build(root, b, mini["lock3"], mini["wheelhouse"])
    tool(root, "switch", b)
    assert (status(root)["current"], status(root)["previous"]) == (b, a)
    out = subprocess.run([str(root / "engine/current/bin/python"), "-c", "import sniffio, idna, annotated_types"])
    assert out.returncode == 0

    # the deploy's records (roles/service.py): each environment's launch spec, checked against it
    for env, module in ((a, "idna"), (b, "annotated_types")):
        record(root, env, module)
    conf = root / "conf"
    conf.mkdir()
    for name in ("launch.json", "glm-flash.env"):
        (conf / name).write_bytes((root / "engine/envs" / b / ".glm-flash-service" / name).read_bytes())
        os.chmod(conf / name, 0o640)
    r = tool(root, "rollback", "--no-restart")
    assert (status(root)["current"], status(root)["previous"]) == (a, b) and "rolled back" in r.stdout
    assert runs_its_spec(root) == "idna"  # a's spec, which a's python runs (b's names a module a lacks)
    assert oct(os.stat(conf / "launch.json").st_mode & 0o777) == "0o640"
    tool(root, "rollback", "--no-restart")
    assert (status(root)["current"], status(root)["previous"]) == (b, a)
    assert runs_its_spec(root) == "annotated_types"

    # an environment with no recorded spec (an older deploy's) is not rolled back to
    shutil.rmtree(root / "engine/envs" / a / ".glm-flash-service")
    r = tool(root, "rollback", "--no-restart", check=False)
    assert r.returncode == 2 and "no launch.json recorded" in r.stderr, r.stderr
    assert (status(root)["current"], status(root)["previous"]) == (b, a)
    assert runs_its_spec(root) == "annotated_types"
    record(root, a, "idna")

    (root / "engine/envs" / c).mkdir()  # a failed upgrade's leftovers
    tool(root, "prune")
    assert sorted(status(root)["envs"]) == sorted([a, b])


def record(root: Path, env: str, module: str) -> None:
    """What roles/service.py writes with an environment: the launch spec its parser accepted."""
    d = root / "engine/envs" / env / ".glm-flash-service"
    d.mkdir(mode=0o700, exist_ok=True)
    spec = {"python": str(root / "engine/current/bin/python"), "module": module, "args": ["--port", "30000"]}
    (d / "launch.json").write_text(json.dumps(spec, indent=2) + "\n")
    (d / "glm-flash.env").write_text(f"HOME=/var/lib/glm-flash\nENGINE_MODULE={module}\n")


def runs_its_spec(root: Path) -> str:
    """Start what the service would: the spec in the configuration directory, with its python."""
    spec = json.loads((root / "conf/launch.json").read_text())
    env = (root / "conf/glm-flash.env").read_text()
    assert f"ENGINE_MODULE={spec['module']}" in env, "the environment file goes with the spec"
    r = subprocess.run([spec["python"], "-c", f"import {spec['module']}"], capture_output=True, text=True)
    assert r.returncode == 0, f"{spec['python']} cannot run {spec['module']}: {r.stderr}"
    return spec["module"]


def archive(tmp_path: Path, member: tarfile.TarInfo) -> Path:
    path = tmp_path / "python.tar.gz"
    with tarfile.open(path, "w:gz") as t:
        data = b"print('hi')\n"
        ok = tarfile.TarInfo("bin/ok.py")
        ok.size = len(data)
        t.addfile(ok, io.BytesIO(data))
        if member.isreg():
            member.size = len(data)
            t.addfile(member, io.BytesIO(data))
        else:
            t.addfile(member)
    return path


def member(name: str, kind: bytes = tarfile.REGTYPE, mode: int = 0o644, link: str = "") -> tarfile.TarInfo:
    m = tarfile.TarInfo(name)
    m.type, m.mode, m.linkname = kind, mode, link
    return m


@pytest.mark.parametrize(
    "bad",
    [
        member("bin/shadow", tarfile.SYMTYPE, link="/etc/shadow"),
        member("bin/up", tarfile.SYMTYPE, link="../../../etc"),
        member("bin/passwd", tarfile.LNKTYPE, link="/etc/passwd"),
        member("bin/su", mode=0o4755),
        member("bin/sg", mode=0o2755),
        member("dev/mem", tarfile.CHRTYPE),
        member("bin/pipe", tarfile.FIFOTYPE),
        member("/bin/abs"),  # the data filter alone would unpack it as bin/abs
        member("bin/../lib/x"),  # and this one, inside dest
    ],
    ids=["absolute-link", "link-outside", "hardlink-outside", "setuid", "setgid", "device", "fifo", "abs", "dots"],
)
def test_an_interpreter_archive_with_a_link_out_a_device_or_setid_member_is_refused(tmp_path, bad):
    path = archive(tmp_path, bad)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    dest = tmp_path / "python" / "cpython"
    r = tool(tmp_path, "python-install", "--archive", str(path), "--dest", str(dest), "--sha256", digest, check=False)
    assert r.returncode == 2 and f"member {bad.name!r} is" in r.stderr and "Nothing was unpacked" in r.stderr, r.stderr
    assert not dest.exists() and not any((dest.parent / "cpython.partial").iterdir())


def test_verify_and_assert_pin(tmp_path, mini):
    root = tmp_path / "root"
    env = "0.7.0.post1-dddddddddddd"
    lock = root / "engine/locks" / f"{env}.json"
    lock.parent.mkdir(parents=True)
    lock.write_text(mini["lock3"].read_text())
    tool(root, "build", env, "--python", base_python(), "--wheelhouse", str(mini["wheelhouse"]))
    tool(root, "switch", env)
    report = json.loads(tool(root, "verify", "--full", "--json").stdout)
    assert report["problems"] == [] and report["complete"]
    assert {n: report["versions"][n] for n in NAMES} == {p.name: p.version for p in mini["pins"]}

    # a file changed behind the installer's back is found by its RECORD hash
    sp = next((root / "engine/envs" / env / "lib").glob("python3.*/site-packages"))
    (sp / "idna" / "core.py").write_text("# changed\n")
    report = json.loads(tool(root, "verify", "--full", "--json", check=False).stdout)
    assert any("idna" in p and "differ from RECORD" in p for p in report["problems"])
    # ... unless the patch tool's manifest accounts for it
    manifest = root / "patch-state" / "manifests" / "x.json"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(
        json.dumps(
            {"files": {str(sp / "idna" / "core.py"): {"patched_sha256": hashlib.sha256(b"# changed\n").hexdigest()}}}
        )
    )
    assert json.loads(tool(root, "verify", "--full", "--json").stdout)["problems"] == []

    # a pin removed by hand is put back from the wheelhouse; a right one is left alone
    python = str(root / "engine/current/bin/python")
    subprocess.run([str(tools_bin() / "uv"), "pip", "uninstall", "-q", "--python", python, "sniffio"], check=True)
    report = json.loads(tool(root, "verify", "--json", check=False).stdout)
    assert any(p.startswith("sniffio: missing installed") for p in report["problems"])
    # as the deploy's engine-pin job runs it (roles/engines/kt/engine.py: ReadWritePaths= the
    # environment alone, a private /tmp): bwrap with everything read-only but the environment and a TMPDIR
    env_dir = str((root / "engine/envs" / env).resolve())
    scratch = tmp_path / "private-tmp"
    scratch.mkdir()
    jailed = ["--ro-bind", "/", "/", "--bind", env_dir, env_dir, "--bind", str(scratch), str(scratch)]
    jailed += ["--setenv", "TMPDIR", str(scratch), "--dev", "/dev", "--proc", "/proc"]
    r = tool(root, "assert-pin", env, "sniffio", "--wheelhouse", str(mini["wheelhouse"]), jail=jailed)
    assert "reinstalling" in r.stdout
    assert "as locked" in tool(root, "assert-pin", env, "sniffio", "--wheelhouse", str(mini["wheelhouse"])).stdout
    assert not (root / "engine/envs" / env / ".glm-flash-uv-cache").exists()  # the install's own cache, gone


def test_rollback_without_previous_is_refused(tmp_path):
    r = tool(tmp_path, "rollback", "--no-restart", check=False)
    assert r.returncode == 2 and "no previous environment" in r.stderr


def test_called_as_glm_flash_rollback(tmp_path):
    link = tmp_path / "glm-flash-rollback"
    link.symlink_to(TOOL)
    r = subprocess.run(
        [sys.executable, str(link), "--no-restart"],
        capture_output=True,
        text=True,
        env=dict(os.environ, GLM_FLASH_ROOT=str(tmp_path)),
    )
    assert r.returncode == 2 and "no previous environment" in r.stderr


def shared_directory_env(tmp_path) -> tuple[str, Path]:
    """An environment where transformers-kt and transformers both list transformers/core.py,
    holding the kt fork's content; (env name, site-packages)."""
    env = "0.7.0.post1-eeeeeeeeeeee"
    sp = tmp_path / "engine/envs" / env / "lib/python3.11/site-packages"
    (sp / "transformers").mkdir(parents=True)
    (sp / "transformers/core.py").write_text("kt = True\n")
    digest = base64.urlsafe_b64encode(hashlib.sha256(b"kt = True\n").digest()).rstrip(b"=").decode()
    for name, version, record in (
        ("transformers-kt", "5.6.0.post3", f"transformers/core.py,sha256={digest},10\n"),
        ("transformers", "5.6.0", "transformers/core.py,sha256=other,10\n"),
    ):
        d = sp / f"{name.replace('-', '_')}-{version}.dist-info"
        d.mkdir()
        (d / "METADATA").write_text(f"Name: {name}\nVersion: {version}\n\n")
        (d / "RECORD").write_text(record)
    (tmp_path / "engine/envs" / env / ".glm-flash-complete").write_text("{}")
    return env, sp


def test_status_reports_the_owner_of_a_shared_directory(tmp_path):
    """transformers-kt must have written transformers/ last (docs/sources.md §2): the tool
    hashes the files its RECORD lists; the fact turns that into owner_ok."""
    env, sp = shared_directory_env(tmp_path)
    state = EngineEnvs.parse(tool(tmp_path, "status", "--json").stdout.splitlines())
    assert state.complete == (env,) and state.version(env, "transformers-kt") == "5.6.0.post3"
    assert state.owner_ok(env) is True
    (sp / "transformers/core.py").write_text("upstream = True\n")  # upstream transformers wrote last
    assert EngineEnvs.parse(tool(tmp_path, "status", "--json").stdout.splitlines()).owner_ok(env) is False


def owner_ok(root: Path, env: str, ahead_s: float = 0.0) -> bool:
    return EngineEnvs.parse(tool(root, "status", "--json", ahead_s=ahead_s).stdout.splitlines()).owner_ok(env)


@pytest.mark.skipif(os.geteuid() != 0, reason="not applicable: only root keeps owner-check records")
def test_status_answers_the_owner_check_from_roots_record_until_a_file_changes(tmp_path):
    """The owner check hashes every file transformers-kt lists (2600 on a real host) on every
    deploy; unchanged files (same inode, size, times) are answered from root's record."""
    env, sp = shared_directory_env(tmp_path)
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    os.chmod(tmp_path, 0o755)
    checks = state / "engine-checks"
    assert owner_ok(tmp_path, env) is True
    assert not checks.exists() or not any(checks.iterdir())  # files changed under 2 s ago: not recorded
    assert owner_ok(tmp_path, env, ahead_s=2.1) is True  # 2.1 s later: settled, recorded
    (record,) = checks.iterdir()
    assert checks.stat().st_mode & 0o777 == 0o700 and record.stat().st_mode & 0o777 == 0o600
    # The next status answers from the record: a record that says otherwise is believed...
    saved = json.loads(record.read_text())
    record.write_text(json.dumps({"key": saved["key"], "bad": [str(sp / "transformers/core.py")]}))
    assert owner_ok(tmp_path, env, ahead_s=2.1) is False
    # ...until a file it covers changes (same size: the times and the inode tell).
    record.write_text(json.dumps(saved))
    assert owner_ok(tmp_path, env, ahead_s=2.1) is True
    (sp / "transformers/core.py").write_text("up = True\n\n")  # upstream transformers wrote last
    assert owner_ok(tmp_path, env) is False
    assert owner_ok(tmp_path, env, ahead_s=2.1) is False
    assert json.loads(record.read_text())["bad"] == [str(sp / "transformers/core.py")]


@pytest.mark.skipif(os.geteuid() != 0, reason="not applicable: only root keeps owner-check records")
def test_an_owner_record_directory_others_could_change_is_not_used(tmp_path):
    env, sp = shared_directory_env(tmp_path)
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, 0o777)  # writable by everyone: the service user could plant an answer there
    os.chmod(tmp_path, 0o755)
    assert owner_ok(tmp_path, env, ahead_s=2.1) is True  # settled: a record would be written here
    assert not (state / "engine-checks").exists()
    (sp / "transformers/core.py").write_text("up = True\n\n")
    assert owner_ok(tmp_path, env) is False


def test_the_environment_holds_the_unpacked_files_not_copies_of_them(tmp_path, mini, monkeypatch):
    """uv unpacks each wheel into the install's own cache, then links the environment's files to
    the unpacked ones (--link-mode hardlink): the set takes its size once on disk during the
    install, not twice (11 GiB for the L40S set). Seen where it can differ: a file of the
    environment has two links just before the cache is deleted (a copy would have one), and one
    after (nothing shared with a deleted cache or another environment)."""
    from tests.unit.test_engine_lock import host_tool

    mod = host_tool()
    uv = str(tools_bin() / "uv")
    env_dir = tmp_path / "env"
    subprocess.run([uv, "venv", "--quiet", "--no-config", "--python", base_python(), str(env_dir)], check=True)
    site = next(env_dir.glob("lib/python*/site-packages"))
    links_before_delete = []
    real_rmtree = shutil.rmtree

    def rmtree(path, *args, **kwargs):
        if str(path).endswith(".glm-flash-uv-cache") and (site / "idna" / "__init__.py").exists():
            links_before_delete.append((site / "idna" / "__init__.py").stat().st_nlink)
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", rmtree)
    pins = mod.read_lock(str(mini["lock3"]))
    mod.install(uv, str(env_dir), str(mini["wheelhouse"]), list(pins.values()))
    assert links_before_delete == [2]
    assert not (env_dir / ".glm-flash-uv-cache").exists()
    assert (site / "idna" / "__init__.py").stat().st_nlink == 1
