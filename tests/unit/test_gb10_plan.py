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

import runpy
from pathlib import Path

import pytest
from fakehost import F, FakeHost, on, render
from pyinfra.api import OperationError
from pyinfra.facts.files import File
from pyinfra.facts.server import Arch

from control.profile import build
from roles import engine_vllm
from roles.facts.capacity import BoxCapacity
from roles.facts.driver import Kernels, NvidiaLoadedModule, NvidiaModuleOnDisk, NvidiaPciDevices, RebootRequired
from roles.facts.engine import EngineEnvs, EngineState
from roles.facts.gb10 import MemTotalKiB, OsRelease
from roles.facts.system import CudaToolkits, DefaultTarget, GpuProcesses, Gpus, NumaNodes, UnitFiles
from roles.summary import HostStatus

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
        EngineEnvs: EngineState(),
        # Preflight: what the GX10 reports (20 cores, its meminfo, a 1 TB disk with room).
        BoxCapacity: BoxCapacity.parse(
            ["cpus 20", "cores 0", "Features\t: fp asimd sve2", *lines("gb10-meminfo.txt")[:1]]
            + ["df 0 800000000000 /", "df 1 800000000000 /", "envs 0"]
        ),
        HostStatus: {},
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


OURS = ("roles.",)


def run_deploy(
    monkeypatch, facts, inventory=INVENTORY, extra_facts_for=None, patch_state=None
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
            if getattr(op, "__module__", "").startswith(OURS):
                cmds = [render(c) for c in op._inner(*args, **kwargs)]
            plan.calls.append((op.__name__, name, kwargs, cmds, control))
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

    for info in pkgutil.iter_modules(roles.__path__):
        try:
            module = importlib.import_module(f"roles.{info.name}")
        except ImportError:
            continue
        for attr in dir(module):
            obj = getattr(module, attr)
            if callable(obj) and hasattr(obj, "_inner") and getattr(obj, "__module__", "").startswith(OURS):
                monkeypatch.setattr(module, attr, recorder(obj))
    # engine_patches.engine_patched is a module-level op of roles/: the loop above records it
    from roles import engine_patches

    assert engine_patches.engine_patched.__module__ == __name__, "engine_patched is not recorded"
    fake.facts[engine_patches.EnginePatchCheck] = patch_state or {"exit": None, "files": {}, "lines": []}
    if extra_facts_for:
        extra_facts_for(fake, monkeypatch)
    with on(fake):
        runpy.run_path(str(REPO / "deploy.py"), run_name="__deploy__")
    return plan, fake


def model_facts(fake, monkeypatch, main_ok=True, drafter_ok=False):
    """The model role's facts: the staged 2-bit checkpoint, the drafter download marker."""
    from roles import model

    check = model.ModelCheck
    p = build("gx10.example.lan", INVENTORY, api_key_present=False)
    tool = f"{p.install_root}/bin/glm-flash-model-fetch"
    ok = {"exit": 0, "state": "ok", "reason": ""}
    missing = {"exit": 1, "state": "missing", "reason": "not downloaded"}
    fake.facts[F(check, tool=tool, dest=p.model_path)] = ok if main_ok else missing
    fake.facts[F(check, tool=tool, dest=p.drafter_path, repo=p.drafter_model, revision=p.drafter_revision)] = (
        ok if drafter_ok else missing
    )
    fake.facts[F(File, path=f"{p.install_root}/tools/hf-hub/.glm-flash-complete")] = (
        {"mode": 644} if drafter_ok else None
    )
    fake.facts[check] = missing


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
    assert f[OsRelease].is_dgx_os and f[OsRelease].describe() == "Ubuntu 24.04.3 LTS (NVIDIA DGX Spark 7.2.3)"


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
    assert plan.shell("Boot into multi-user.target") == ["systemctl set-default multi-user.target"]
    assert plan.find("Stop and disable gdm3")
    # fresh: build beside, patch, middleware, drafter, then switch
    build_cmd = plan.shell("Build vLLM-Moet")
    assert build_cmd == [
        f"/opt/glm-flash/bin/glm-flash-vllm-build {env} --repo https://github.com/lrozewicz/vLLM-Moet-GB10 "
        f"--ref {REF} --python /usr/bin/python3.12 --torch-index https://download.pytorch.org/whl/cu130 "
        f"--arch 12.1 --cuda-home /usr/local/cuda-13.0"
    ]
    patch = plan.find("vLLM patches in")[0]
    assert patch[3] == [
        f"/opt/glm-flash/bin/glm-flash-patch apply /opt/glm-flash/engine/envs/{env}/glm-flash-patches/vllm-0.33.0-gb10.json"
    ]
    assert (
        plan.find("Thinking-budget middleware")[0][2]["dest"]
        == f"/opt/glm-flash/engine/envs/{env}/lib/python3.12/site-packages/glm_flash_defaults.py"
    )
    drafter = plan.shell("Download incoai/GLM-5.3-Flash-DFlash2@main into /srv/models/GLM-5.3-Flash-DFlash2")
    assert len(drafter) == 1 and "--repo incoai/GLM-5.3-Flash-DFlash2" in drafter[0]
    assert plan.shell("Switch engine current") == [
        f"/opt/glm-flash/bin/glm-flash-engine switch {env}",
        f"/opt/glm-flash/bin/glm-flash-engine prune --keep {env}",
    ]
    order = [
        names.index(plan.find(t)[0][1])
        for t in (
            "Build vLLM-Moet",
            "vLLM patches in",
            "Thinking-budget",
            "Download incoai",
            "Switch engine current",
            "glm-flash.service unit",
        )
    ]
    assert order == sorted(order)
    # the service: launch spec with the vLLM flags, the budget in its environment, page cache flushed
    launch = plan.find("Launch flags")[0][2]["src"].getvalue()
    assert '"module": "vllm.entrypoints.launchers.api_server.entry"' in launch
    assert '"--max-model-len",\n    "204800"' in launch and '"--mamba-cache-mode",\n    "align"' in launch
    unit = plan.find("glm-flash.service unit")[0][2]
    assert unit["drop_page_cache"] is True and unit["engine"] == "vLLM"
    assert plan.find("Service environment")[0][2]["extra_env"]["GLM_FLASH_DEFAULT_THINKING_TOKEN_BUDGET"] == "1536"
    restart = plan.find("Restart glm-flash.service after its configuration or engine changed")
    assert restart and "_if" in restart[0][4]


def test_fork_already_built_at_the_pinned_ref_builds_nothing(monkeypatch, profile):
    env = engine_vllm.env_id(profile)
    state = EngineState(current=env, previous=None, complete=(env,), present=(env,))
    done = {"exit": 0, "files": {"x": {"state": "applied"}}, "lines": []}
    plan, _ = run_deploy(
        monkeypatch,
        gb10_facts({EngineEnvs: state}),
        patch_state=done,
        extra_facts_for=lambda f, m: model_facts(f, m, drafter_ok=True),
    )
    assert not plan.find("Build vLLM-Moet")
    assert not plan.find("Switch engine current")
    assert plan.find("vLLM patches in")[0][3] == []  # checked, nothing pending
    assert not plan.find("Download incoai")


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
    assert plan.shell("Build vLLM-Moet")[0].startswith(f"/opt/glm-flash/bin/glm-flash-vllm-build {new} ")
    assert f"--ref {NEW_REF}" in plan.shell("Build vLLM-Moet")[0]
    assert plan.shell("Switch engine current") == [
        f"/opt/glm-flash/bin/glm-flash-engine switch {new}",
        f"/opt/glm-flash/bin/glm-flash-engine prune --keep {new}",
    ]
    # the old environment is not touched before the switch (it keeps serving)
    assert not any(old in cmd for c in plan.calls for cmd in c[2].get("commands", []))


def test_driver_too_old_fails_clearly(monkeypatch):
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
    with pytest.raises(OperationError) as e:
        run_deploy(monkeypatch, facts, extra_facts_for=model_facts)
    msg = str(e.value)
    assert "570.133.20 is older than 580.0" in msg and "Fix:" in msg and "gx10.example.lan" in msg


def test_not_a_gb10_box_stops_before_anything_of_the_engine(monkeypatch, capsys):
    facts = gb10_facts({Arch: "x86_64"})
    with pytest.raises(SystemExit) as e:
        run_deploy(monkeypatch, facts, extra_facts_for=model_facts)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "platform: gb10, but the host's architecture: uname -m says x86_64" in err


def test_licence_is_shown_at_deploy_time(monkeypatch, caplog):
    import logging

    caplog.set_level(logging.WARNING, logger="pyinfra")
    run_deploy(monkeypatch, gb10_facts(), extra_facts_for=model_facts)
    assert any(
        "CC-BY-NC-ND-4.0" in r.getMessage() and "incoai/GLM-5.3-Flash-DFlash2" in r.getMessage() for r in caplog.records
    )
