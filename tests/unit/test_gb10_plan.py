"""The deploy's plan for a GB10 box, from recorded GB10 facts (tests/unit/data/gb10-*).

deploy.py itself runs against a fake host (tests/unit/fakehost.py) whose facts are parsed
from recorded output in the tools' own formats: `nvidia-smi --query-gpu` csv, `uname -m`,
DGX OS's /etc/os-release and /etc/dgx-release, /proc/meminfo, /proc/driver/nvidia/version,
sysfs PCI ids. Every operation deploy.py calls is recorded (its name and arguments);
operations of ours are also expanded to the commands their inner generator yields
on those facts, as in pyinfra's own operation tests. A fact the test did not supply fails
the test, so the plan cannot read anything unnoticed.

Simulated: the GB10 box (no GPU, no aarch64, no DGX OS here). What the operations do on a
real system is tested elsewhere (tests/sandbox, tests/gb10 against real vLLM files).
"""

from __future__ import annotations

import hashlib
import json
import runpy
from pathlib import Path

import pytest
from fakehost import F, FakeHost, on, render
from pyinfra.facts.files import File, Sha256File
from pyinfra.facts.server import Arch
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from control import engine_lock, layout
from control.profile import build
from roles.engines.vllm import engine as engine_vllm
from roles.facts.accounts import Account, AccountInfo
from roles.facts.capacity import BoxCapacity
from roles.facts.driver import Kernels, NvidiaLoadedModule, NvidiaModuleOnDisk, NvidiaPciDevices, RebootRequired
from roles.facts.engine import EngineEnvs, EnginePatchCheck, EngineState, LaunchFlagCheck
from roles.facts.gb10 import MemTotalKiB, OsRelease
from roles.facts.service import ServiceStart, ServiceStartState, SystemdVersion
from roles.facts.status import Answers, HostStatus
from roles.facts.system import CudaToolkits, DefaultTarget, GpuProcesses, Gpus, HostPython, NumaNodes, UnitFiles
from roles.operations import driver as driver_ops
from roles.operations.checkpoint import download_unit_path, token_file

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"
REF = "3f9a1c0d2b7e4a6f8c1d0e9b7a5c3e1f2d4b6a8c"
NEW_REF = "9b8a7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b"
INVENTORY = {"platform": "gb10", "vllm_ref": REF, "accept_drafter_license": True}


def lines(name: str) -> list[str]:
    return (DATA / name).read_text().splitlines()


def gb10_facts(over=None):
    """A GB10 box as it comes: DGX OS, driver 580.95.05 loaded, CUDA 13.0, nothing of ours."""
    facts = {
        Arch: lines("gb10-uname-m.txt")[0],
        # What DGX OS's python3 says of itself (roles/facts/system.py HostPython): the public record's
        # Ubuntu 24.04 arm64 (python3 3.12, libc6 2.39; docs/sources.md §14), not read off a box.
        HostPython: HostPython.parse(lines("gb10-python3.json")),
        OsRelease: OsRelease.parse(lines("gb10-os-release.txt") + [OsRelease.SEP] + lines("gb10-dgx-release.txt")),
        MemTotalKiB: MemTotalKiB.parse(lines("gb10-meminfo.txt")),
        Gpus: Gpus.parse(lines("gb10-nvidia-smi-query-gpu.csv")),
        GpuProcesses: [],
        NumaNodes: 1,
        NvidiaPciDevices: NvidiaPciDevices.parse(lines("gb10-pci-devices.txt")),
        NvidiaLoadedModule: NvidiaLoadedModule.parse(lines("gb10-proc-driver-nvidia-version.txt")),
        NvidiaModuleOnDisk: "580.95.05",
        Kernels: Kernels.parse(lines("gb10-kernels.txt")),
        RebootRequired: RebootRequired.default(),
        CudaToolkits: {"13.0": "/usr/local/cuda-13.0"},
        DefaultTarget: "graphical.target",
        UnitFiles: {"gdm3.service": "enabled", "ssh.service": "enabled"},
        SystemdStatus: {"gdm3.service": True},
        SystemdEnabled: {"gdm3.service": True},
        EngineEnvs: EngineState(),
        SystemdVersion: 255,  # Ubuntu 24.04's (DGX OS 7)
        ServiceStartState: ServiceStart(),  # never started
        # Preflight: what the GX10 reports (20 cores, its meminfo, a 1 TB disk with room).
        BoxCapacity: BoxCapacity.parse(
            ["cpus 20", "cores 0", "Features\t: fp asimd sve2", *lines("gb10-meminfo.txt")[:1]]
            + ["df 0 800000000000 /", "df 1 800000000000 /", "envs 0"]
        ),
        HostStatus: {},
        Answers: True,
    }
    facts.update(over or {})
    return facts


class Plan:
    """Every operation call of a deploy.py run: (op, name, kwargs, commands or None)."""

    def __init__(self):
        self.calls = []

    def names(self) -> list[str]:
        return [c[1] for c in self.calls]

    def find(self, text: str) -> list[tuple]:
        return [c for c in self.calls if text in c[1]]

    def commands(self, text: str) -> list[str]:
        return [cmd for c in self.find(text) for cmd in (c[3] or [])]

    def shell(self, text: str) -> list[str]:
        return [cmd for c in self.find(text) for cmd in c[2].get("commands", [])]


OURS = ("roles.", "pyinfra_ext.")
# Ours, but thin checks in front of pyinfra's own files/server operations: recorded like those.
OPAQUE = ("roles.operations.paths", "roles.operations.accounts", "roles.operations.packages", "roles.operations.units")


def run_deploy(
    monkeypatch, facts, inventory=INVENTORY, extra_facts_for=None, patch_state=None, flag_state=None
) -> tuple[Plan, FakeHost]:
    """Run deploy.py for one GB10 host on `facts`; return the recorded plan."""
    import pyinfra.operations.apt as apt
    import pyinfra.operations.files as files
    import pyinfra.operations.server as server
    import pyinfra.operations.systemd as systemd

    import roles

    plan = Plan()
    fake = FakeHost(facts, name="gx10.example.lan")
    fake.data = type("Data", (), {"dict": staticmethod(lambda: dict(inventory))})()

    class Op:
        will_change = True
        did_change = staticmethod(lambda: True)

    def recorder(op):
        def call(*args, **kwargs):
            name = kwargs.pop("name", op.__name__)
            control = {k: kwargs.pop(k) for k in list(kwargs) if k.startswith("_")}
            cmds = None
            if getattr(op, "__module__", "").startswith(OURS) and op.__module__ not in OPAQUE:
                cmds = [render(c) for c in op._inner(*args, **kwargs)]
            plan.calls.append((op.__name__.lstrip("_"), name, kwargs, cmds, control))
            return Op()

        call._inner = op._inner
        call.__name__ = op.__name__
        return call

    for module in (apt, files, server, systemd):
        for attr in dir(module):
            obj = getattr(module, attr)
            if callable(obj) and hasattr(obj, "_inner"):
                monkeypatch.setattr(module, attr, recorder(obj))
    import importlib
    import pkgutil

    import pyinfra_ext
    import roles.operations

    ours = [i.name for i in pkgutil.walk_packages(roles.__path__, "roles.")]
    ours += [f"roles.operations.{i.name}" for i in pkgutil.iter_modules(roles.operations.__path__)]
    ours += [f"pyinfra_ext.{i.name}" for i in pkgutil.iter_modules(pyinfra_ext.__path__)]
    for name in ours:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        for attr in dir(module):
            obj = getattr(module, attr)
            if callable(obj) and hasattr(obj, "_inner") and getattr(obj, "__module__", "").startswith(OURS):
                monkeypatch.setattr(module, attr, recorder(obj))
    # the roles call the operations they import by name: the loop above records them where they are called
    fake.facts[EnginePatchCheck] = patch_state or {"exit": None, "files": {}, "lines": []}
    fake.facts[LaunchFlagCheck] = flag_state or {"exit": None, "lines": []}  # None: not built yet
    if extra_facts_for:
        extra_facts_for(fake, monkeypatch)
    with on(fake):
        runpy.run_path(str(REPO / "deploy.py"), run_name="__deploy__")
    return plan, fake


DRAFTER_COMMIT = "bf582e4eacc1810f76656d1811693ff6c6737d2a"  # the profile's pin (docs/sources.md §20)
MODEL_COMMIT = "d4a1f7e0" * 5  # simulated: the hub is not reachable here, so the model's lock is the test's


def model_facts(fake, monkeypatch, main_ok=True, drafter_ok=False):
    """The model role's facts: the FP8 checkpoint's and the drafter's downloads, the downloader."""
    import tempfile

    from control import model_lock
    from roles import model
    from roles.facts.model import DownloaderMarker, UnitActive

    lock = Path(tempfile.mkdtemp()) / "model.json"
    monkeypatch.setattr(model_lock, "LOCK", lock)
    check = model.ModelCheck
    p = build("gx10.example.lan", INVENTORY, api_key_present=False)
    assert p.drafter_revision == DRAFTER_COMMIT and p.model_download and p.model_path == "/srv/models/GLM-5.3-Flash"
    model_lock.record(p.model_id, p.model_revision, MODEL_COMMIT)
    tool = f"{p.install_root}/bin/glm-flash-model-fetch"
    ok = {"exit": 0, "state": "ok", "reason": "", "sealed": True}
    missing = {"exit": 1, "state": "missing", "reason": "not downloaded", "sealed": False}
    fake.facts[F(check, tool=tool, dest=p.model_path, repo=p.model_id, revision=MODEL_COMMIT)] = (
        ok if main_ok else missing
    )
    fake.facts[F(check, tool=tool, dest=p.drafter_path, repo=p.drafter_model, revision=DRAFTER_COMMIT)] = (
        ok if drafter_ok else missing
    )
    requirements = (REPO / "files" / "hf-hub-requirements.txt").read_bytes()
    fake.facts[DownloaderMarker] = hashlib.sha256(requirements).hexdigest() if drafter_ok else ""
    fetch = AccountInfo("/nonexistent", "/usr/sbin/nologin", f"{p.service_user}-fetch", frozenset())
    fake.facts[F(Account, user=f"{p.service_user}-fetch")] = fetch if drafter_ok else None
    for unit in (model.DRAFTER_UNIT, model.MODEL_UNIT):
        fake.facts[F(File, path=token_file(unit))] = None
        fake.facts[F(File, path=download_unit_path(unit))] = None
    fake.facts[UnitActive] = "inactive"
    fake.facts[check] = missing
    # uv (locks/tools.txt), the downloader's builder: its aarch64 build there once the downloader is
    uv, there = layout.host_uv(p), None
    if drafter_ok:
        data = engine_lock.host_uv(engine_lock.Target.of_interpreter(fake.facts[HostPython])).read()
        there = {"user": "root", "group": "root", "mode": 755, "size": len(data)}
        fake.facts[F(Sha256File, path=uv)] = hashlib.sha256(data).hexdigest()
    fake.facts[F(File, path=uv)] = there


@pytest.fixture(autouse=True)
def vllm_locks(tmp_path, monkeypatch):
    """A copy of locks/vllm/ the tests may change (the real lock: `make vllm-lock`)."""
    d = tmp_path / "vllm-locks"
    d.mkdir()
    for f in (REPO / "locks" / "vllm").iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    monkeypatch.setattr(engine_vllm, "LOCK_DIR", d)
    return d


@pytest.fixture
def profile():
    return build("gx10.example.lan", INVENTORY, api_key_present=False)


def test_facts_recognise_the_gb10_box():
    f = gb10_facts()
    from roles.facts.gb10 import Gb10View

    view = Gb10View(f[Arch], f[OsRelease], tuple(f[Gpus]), f[MemTotalKiB])
    assert view.problems() == []
    assert view.unified_memory and view.unified_gib == 121.6
    assert f[Gpus][0].compute_capability == "12.1" and f[Gpus][0].name == "NVIDIA GB10"
    assert f[OsRelease].dgx and f[OsRelease].describe() == "Ubuntu 24.04.3 LTS (NVIDIA DGX Spark 7.2.3)"


def test_fresh_gb10_box_plan(monkeypatch, profile):
    plan, fake = run_deploy(monkeypatch, gb10_facts(), extra_facts_for=model_facts)
    names = plan.names()
    env = engine_vllm.env_id(profile)
    # DGX OS keeps its apt sources; no Debian sources, no NVIDIA repo, no driver install
    assert not plan.find("Debian apt sources") and not plan.find("NVIDIA CUDA apt repository")
    assert plan.find("Base packages")[0][2]["packages"][:3] == ["ca-certificates", "curl", "git"]
    # the preinstalled driver is verified, not installed (driver role, driver_source preinstalled)
    assert plan.find("Driver is 580.0 or newer") and plan.find("Driver is 580.0 or newer")[0][3] == []
    assert not plan.find("Driver 580 with headers")
    # headless as on the L40S box
    assert plan.commands("Boot into multi-user.target") == ["systemctl set-default multi-user.target"]
    assert plan.commands("Display managers stopped") == [
        "systemctl stop gdm3.service",
        "systemctl disable gdm3.service",
    ]
    # fresh: build beside (wheels, the fork's patch checked then applied, its kernels), middleware, drafter, switch
    # several GB of wheels: as the transient unit glm-flash-job-engine-build (roles/operations/job.py)
    assert plan.commands("vLLM-Moet") == ["function _follow"]
    assert plan.find(f"vLLM 0.24.0 + vLLM-Moet {REF[:12]} + DeepGEMM a6b593d28267 built into {env}")
    assert " ".join(engine_vllm.build_argv(profile, env)) == (
        f"/opt/glm-flash/bin/glm-flash-vllm-build {env} --python /usr/bin/python3.12 --uv /opt/glm-flash/tools/uv "
        f"--lock /opt/glm-flash/engine/locks/{env}.vllm.txt --vllm-version 0.24.0 "
        f"--fork-repo https://github.com/lrozewicz/vLLM-Moet-GB10 --fork-commit {REF} "
        "--fork-patch patch/vllm-moet-v0.24.0.patch --fork-kernels kernels/cubins-sm120 "
        "--deepgemm-repo https://github.com/deepseek-ai/DeepGEMM.git "
        "--deepgemm-commit a6b593d2826719dcf4892609af7b84ee23aaf32a"
    )
    # no patch set of ours on top of the fork: its patch carries the scheduler fix (checked by the build)
    assert not plan.find("vLLM patches in") and not plan.find("Patch set")
    tools = [c[2]["dest"] for c in plan.calls if c[2].get("dest", "").startswith("/opt/glm-flash/bin/")]
    assert {"/opt/glm-flash/bin/glm-flash-vllm-build", "/opt/glm-flash/bin/glm-flash-fork-patch"} <= set(tools), tools
    # every directory a host tool goes into gets the module the tools share first, once, root's and 0644
    dests = [(c[2]["dest"], c[2]) for c in plan.calls if c[2].get("dest", "").startswith("/")]
    modules = [(d, kw) for d, kw in dests if d.endswith("/glm_flash_host.py")]
    tool_dirs = {d.rsplit("/", 1)[0] for d, kw in dests if kw.get("mode") == "755" and "/glm-flash" in d}
    assert (
        sorted(d.rsplit("/", 1)[0] for d, _ in modules)
        == sorted(tool_dirs)
        == [
            "/opt/glm-flash/bin",
            "/usr/local/lib/glm-flash-notify",
        ]
    )
    assert all((kw["user"], kw["group"], kw["mode"]) == ("root", "root", "644") for _, kw in modules)
    first_tool = next(i for i, (d, kw) in enumerate(dests) if d.startswith("/opt/glm-flash/bin/glm-flash"))
    assert dests.index(modules[0]) < first_tool
    assert (
        plan.find("Thinking-budget middleware")[0][2]["dest"]
        == f"/opt/glm-flash/engine/envs/{env}/lib/python3.12/site-packages/glm_flash_defaults.py"
    )
    drafter = plan.commands(f"Download of incoai/GLM-5.3-Flash-DFlash2@{DRAFTER_COMMIT} into /srv/models/")
    (unit,) = [c for c in drafter if c.startswith("upload ") and "[Service]" in c]
    assert "ExecStart=" in unit and "--repo incoai/GLM-5.3-Flash-DFlash2" in unit and "Restart=on-failure" in unit
    assert "/opt/glm-flash/bin/glm-flash-job start glm-flash-drafter-download.service" in drafter
    # waited for at once (the drafter is small): its progress streamed, then the tree sealed
    waited = plan.commands(f"Checkpoint incoai/GLM-5.3-Flash-DFlash2@{DRAFTER_COMMIT} in /srv/models/")
    assert "function _follow" in waited and waited[-1].endswith(
        "seal --dest /srv/models/GLM-5.3-Flash-DFlash2 --owner glm-flash-fetch"
    )
    assert plan.commands("Switch engine current") == [
        f"/opt/glm-flash/bin/glm-flash-engine switch {env}",
        f"/opt/glm-flash/bin/glm-flash-engine prune --keep {env}",
    ]
    # the flags through the patched engine's own parser, which must read each VLLM_* setting
    check = plan.commands("Launch flags accepted by vllm.entrypoints.openai.api_server")
    # root never runs the new environment's python: the tool under the system python starts it as a
    # sandboxed unit of the service user (files/glm-flash-check-flags --engine-python)
    assert len(check) == 1 and check[0].startswith("/usr/bin/python3 -I /opt/glm-flash/bin/glm-flash-check-flags ")
    assert f" --engine-python /opt/glm-flash/engine/envs/{env}/bin/python " in check[0]
    assert " --unit-property User=glm-flash " in check[0] and " --unit-property PrivateNetwork=yes " in check[0]
    assert '"env": ["VLLM_MOE_W2", "VLLM_MOE_W2_CUBIT_DIR", "VLLM_MOE_W2_DELTA_GB", "VLLM_MOE_W2_GATE", ' in check[0]
    order = [
        names.index(plan.find(t)[0][1])
        for t in (
            "built into",
            "Thinking-budget",
            "Download of incoai",
            "Checkpoint incoai",
            "Launch flags accepted",
            "Switch engine current",
            "glm-flash.service unit",
        )
    ]
    assert order == sorted(order)
    # the service: launch spec with the vLLM flags, the budget in its environment, page cache flushed
    launch = next(c for c in plan.find("Launch flags") if "src" in c[2])[2]["src"].getvalue()
    assert '"module": "vllm.entrypoints.openai.api_server"' in launch  # vLLM 0.24.0's server
    assert '"--max-model-len",\n    "204800"' in launch and '"--mamba-cache-mode",\n    "align"' in launch
    unit = plan.find("glm-flash.service unit")[0][2]["src"].getvalue()  # rendered at plan time
    assert "ExecStartPre=+/bin/sh -c 'sync && echo 3 > /proc/sys/vm/drop_caches'" in unit
    # the memory guard: earlyoom on MemAvailable, the engine its first choice (roles/memory_guard.py)
    assert "\nOOMScoreAdjust=1000\n" in unit
    assert plan.find("earlyoom (memory guard)")[0][2]["packages"] == ["earlyoom"]
    drop_in = plan.find("earlyoom acts below 4 GiB of available memory")[0][2]
    assert drop_in["dest"] == "/etc/systemd/system/earlyoom.service.d/glm-flash.conf"
    lines = drop_in["src"].getvalue().splitlines()
    assert lines[-2:] == [
        "ExecStart=",
        "ExecStart=/usr/bin/earlyoom -M 4194304,2097152 -s 100,100 -r 3600 "
        "--avoid '^(sshd|systemd|systemd-journal|earlyoom)$$'",
    ]
    assert plan.find("earlyoom.service started from the files on disk")
    assert "Description=GLM-5.3-Flash inference server (vLLM)" in unit
    env = plan.find("Service environment")[0][2]["src"].getvalue().splitlines()
    assert "GLM_FLASH_DEFAULT_THINKING_TOKEN_BUDGET=1536" in env
    # the fork's runtime knobs with the report's values (docs/sources.md §20); kernels follow `current`
    for line in (
        "VLLM_MOE_W2=1",
        "VLLM_MOE_W2_DELTA_GB=2",
        "VLLM_MOE_W2_GATE=0",
        "VLLM_MOE_W2_CUBIT_DIR=/opt/glm-flash/engine/current/cubit-share",
        "VLLM_MOE_W2_STORE_DIR=/var/lib/glm-flash/moe-w2-store",
        # DGX OS's CUDA 13.0 by path, as the L40S names its toolkit (flashinfer's JIT finds nvcc there)
        "CUDA_HOME=/usr/local/cuda-13.0",
        # and the engine environment's own bin/ first (its pip ninja, which the JIT builds run by name)
        "PATH=/opt/glm-flash/engine/current/bin:/usr/local/cuda-13.0/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    ):
        assert line in env, (line, env)
    # the summary says which expert codes the node serves and what the field measured for each
    from roles.summary import render

    planned = plan.find("Summary: what this host serves now")[0][2]["planned"]
    assert "builds at load from the FP8 checkpoint" in planned["weights"]
    assert "97.0% (159/164) with GPTQ" in planned["weights"] and "95.7% (157/164)" in planned["weights"]
    out = render({"gx10": {**planned, "result": "deployed", "refused": [], "skipped": []}})
    assert "weights: 2-bit expert codes" in out and "make eval SUITE=full" in out
    # the first start builds planes from 306 GiB, writes the FP4 store and JIT-compiles: 7200 s
    assert "TimeoutStartSec=7260" in unit and "--timeout 7200" in unit
    # the FP8 checkpoint, checked by the model role as on the L40S (its facts say it is complete: no download)
    assert plan.find(f"Checkpoint zai-org/GLM-5.3-Flash@{MODEL_COMMIT} (main) in /srv/models/GLM-5.3-Flash")
    assert plan.commands(f"Checkpoint zai-org/GLM-5.3-Flash@{MODEL_COMMIT} (main) in /srv/models/GLM-5.3-Flash") == []
    # never started: a blocking start (the GPU is there), decided from the host's state, its
    # journal lines streamed to the deploy meanwhile (roles/operations/service_restart.py)
    assert plan.commands("glm-flash.service started from the files on disk")[-1] == "function _follow"


def test_fork_already_built_at_the_pinned_ref_builds_nothing(monkeypatch, profile):
    env = engine_vllm.env_id(profile)
    state = EngineState(current=env, previous=None, complete=(env,), present=(env,))
    done = {"exit": 0, "files": {"x": {"state": "applied"}}, "lines": []}
    plan, _ = run_deploy(
        monkeypatch,
        gb10_facts({EngineEnvs: state}),
        patch_state=done,
        flag_state={"exit": 0, "lines": ["ok: 33 arguments accepted (recorded)"]},
        extra_facts_for=lambda f, m: model_facts(f, m, drafter_ok=True),
    )
    assert plan.commands("built into") == []  # checked on the host, nothing to build
    assert plan.commands("Launch flags accepted") == []  # accepted (and recorded) before
    assert plan.commands("Switch engine current") == []
    assert plan.commands("Checkpoint incoai") == []  # present and verified: nothing to do


def test_a_new_deepgemm_commit_is_a_new_environment(profile):
    """DeepGEMM is part of the environment: another commit (or repository) builds anew beside."""
    other = build("gx10.example.lan", dict(INVENTORY, deepgemm_ref="1" * 40), api_key_present=False)
    repo = build(
        "gx10.example.lan", dict(INVENTORY, deepgemm_repo_url="https://example.org/DeepGEMM.git"), api_key_present=False
    )
    envs = {engine_vllm.env_id(p) for p in (profile, other, repo)}
    assert len(envs) == 3 and all(e.startswith(f"vllm-moet-{REF[:12]}-") for e in envs)
    assert f"--deepgemm-commit {'1' * 40}" in " ".join(engine_vllm.build_argv(other, engine_vllm.env_id(other)))


def test_ref_changed_builds_beside_and_switches(monkeypatch, profile):
    old = engine_vllm.env_id(profile)
    state = EngineState(current=old, previous=None, complete=(old,), present=(old,))
    inv = dict(INVENTORY, vllm_ref=NEW_REF)
    new_profile = build("gx10.example.lan", inv, api_key_present=False)
    new = engine_vllm.env_id(new_profile)
    assert new != old and new.startswith("vllm-moet-9b8a7c6d5e4f-")
    plan, _ = run_deploy(
        monkeypatch,
        gb10_facts({EngineEnvs: state}),
        inventory=inv,
        extra_facts_for=lambda f, m: model_facts(f, m, drafter_ok=True),
    )
    assert plan.commands("built into") == ["function _follow"]  # a job, as on a fresh box
    assert plan.find(f"built into {new}")
    argv = " ".join(engine_vllm.build_argv(new_profile, new))
    assert argv.startswith(f"/opt/glm-flash/bin/glm-flash-vllm-build {new} ") and f"--fork-commit {NEW_REF}" in argv
    assert plan.commands("Switch engine current") == [
        f"/opt/glm-flash/bin/glm-flash-engine switch {new}",
        f"/opt/glm-flash/bin/glm-flash-engine prune --keep {new}",
    ]
    # the old environment is not touched before the switch (it keeps serving)
    assert not any(old in cmd for c in plan.calls for cmd in (c[3] or []) + c[2].get("commands", []))


def test_a_fork_setting_the_patched_engine_does_not_read_stops_before_the_switch(monkeypatch, profile):
    env = engine_vllm.env_id(profile)
    state = EngineState(current=None, previous=None, complete=(env,), present=(env,))
    said = (
        "glm-flash-check-flags: vllm.entrypoints.openai.api_server: environment VLLM_MOE_W2_GATE: no file of "
        "the installed vllm reads it (expected the vLLM-Moet fork's patch applied, at a commit that knows this setting)"
    )
    plan, _ = run_deploy(
        monkeypatch,
        gb10_facts({EngineEnvs: state}),
        flag_state={"exit": 1, "lines": ["import noise", said]},
        extra_facts_for=lambda f, m: model_facts(f, m, drafter_ok=True),
    )
    check = plan.commands("Launch flags accepted")
    assert check[0].startswith("echo ") and "VLLM_MOE_W2_GATE: no file of the installed vllm" in check[0]
    assert check[0].endswith(">&2; exit 1") and "import noise" not in check[0]
    names = plan.names()
    assert names.index(plan.find("Launch flags accepted")[0][1]) < names.index(plan.find("Switch engine current")[0][1])


def test_the_checkpoints_architecture_is_checked_with_the_patched_engine_before_the_switch(monkeypatch, profile):
    """The flag check names the checkpoint's config.json: the patched registry must resolve its
    architecture (files/glm-flash-check-flags; the real check on vLLM 0.24.0's files is
    tests/gb10/test_fork_series.py). A fork that does not register it stops the host there."""
    env = engine_vllm.env_id(profile)
    state = EngineState(current=None, previous=None, complete=(env,), present=(env,))
    said = (
        "glm-flash-check-flags: vllm.entrypoints.openai.api_server: architecture Glm5NextForConditionalGeneration "
        "(the checkpoint's config.json) is not in the installed vLLM's model registry"
    )
    plan, _ = run_deploy(
        monkeypatch,
        gb10_facts({EngineEnvs: state}),
        flag_state={"exit": 1, "lines": [said]},
        extra_facts_for=lambda f, m: model_facts(f, m, drafter_ok=True),
    )
    (call,) = plan.find("Launch flags accepted")
    assert json.loads(call[2]["spec_json"])["architectures_of"] == "/srv/models/GLM-5.3-Flash/config.json"
    assert "Glm5NextForConditionalGeneration" in call[3][0] and call[3][0].endswith(">&2; exit 1")
    names = plan.names()
    assert names.index(call[1]) < names.index(plan.find("Switch engine current")[0][1])


def refusal_of(plan: Plan) -> str:
    """The reasons of the one refusal in the plan: the host fails there, only it (#10 item 6)."""
    (call,) = plan.find("Refused")
    assert call[3] == ["function _fail_this_host"]
    return call[2]["reasons"]


def test_driver_too_old_fails_this_host_clearly(monkeypatch):
    """Decided when the check runs, from the host's driver: that host fails there, the others go on."""
    facts = gb10_facts(
        {
            NvidiaLoadedModule: NvidiaLoadedModule.parse(
                [
                    "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  570.133.20  Release Build  (dvs-builder@U16)  Mon Mar 10 2025"
                ]
            ),
            NvidiaModuleOnDisk: "570.133.20",
        }
    )
    plan, _ = run_deploy(monkeypatch, facts, extra_facts_for=model_facts)
    assert plan.find("Driver is 580.0 or newer")[0][3] == ["function _fail_this_host"]
    with on(FakeHost(facts, name="gx10.example.lan")):
        (command,) = driver_ops.driver_at_least._inner(minimum="580.0")
    msg = command.args[0]
    assert "570.133.20 is older than 580.0" in msg and "Fix:" in msg and "gx10.example.lan" in msg


def test_not_a_gb10_box_fails_this_host_before_anything_of_the_engine(monkeypatch):
    facts = gb10_facts({Arch: "x86_64"})
    plan, _ = run_deploy(monkeypatch, facts, extra_facts_for=model_facts)
    msg = refusal_of(plan)
    assert "gx10.example.lan: platform: gb10, but the host's architecture: uname -m says x86_64" in msg
    assert "Fix:" in msg and not plan.find("vLLM-Moet")


def test_licence_is_shown_at_deploy_time(monkeypatch, caplog):
    import logging

    caplog.set_level(logging.WARNING, logger="pyinfra")
    run_deploy(monkeypatch, gb10_facts(), extra_facts_for=model_facts)
    assert any(
        "CC-BY-NC-ND-4.0" in r.getMessage() and "incoai/GLM-5.3-Flash-DFlash2" in r.getMessage() for r in caplog.records
    )


def test_build_without_a_hash_lock_fails_this_host(monkeypatch, vllm_locks):
    (vllm_locks / "0.24.0-aarch64.txt").unlink()
    plan, _ = run_deploy(monkeypatch, gb10_facts(), extra_facts_for=model_facts)
    msg = refusal_of(plan)
    assert "vllm_version: locks/vllm/0.24.0-aarch64.txt is missing" in msg and "make vllm-lock" in msg
    assert not plan.find("Wheel lock of") and not plan.find("built into")


def test_the_lock_goes_up_beside_the_build_and_names_the_environment(monkeypatch, vllm_locks, profile):
    plan, _ = run_deploy(monkeypatch, gb10_facts(), extra_facts_for=model_facts)
    env = engine_vllm.env_id(profile)
    up = plan.find(f"Wheel lock of {env}")[0][2]
    lock = vllm_locks / "0.24.0-aarch64.txt"
    assert up["src"] == str(lock) and up["dest"] == f"/opt/glm-flash/engine/locks/{env}.vllm.txt"
    lock.write_text(lock.read_text().replace("torch==2.11.0", "torch==2.11.1"))
    assert engine_vllm.env_id(profile) != env  # another lock: another environment, built beside


@pytest.mark.parametrize(
    "key, value",
    [
        ("fork_patches", ["patch/vllm-moet-v0.24.1.patch"]),
        ("fork_patches", ["patch/vllm-moet-v0.24.0.patch", "patch/0012-mamba-block-aligned-split.patch"]),
        ("fork_kernels", "kernels/cubins-sm121"),
        ("scheduler_fix_verified_ref", REF),
    ],
)
def test_another_patch_or_kernel_path_is_another_environment(profile, key, value):
    other = build("gx10.example.lan", dict(INVENTORY, **{key: value}), api_key_present=False)
    assert engine_vllm.env_id(other) != engine_vllm.env_id(profile)
