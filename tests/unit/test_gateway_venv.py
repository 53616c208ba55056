"""The gateway's venv replaced with a kill at every step: `venv` is always a whole environment.

roles/fleet/gateway.py venv_commands builds the new lock's environment beside the running one and
swaps the `venv` link (files/glm-flash-gateway-launch swap-venv) in one rename (the first time, from the real directory an older deploy
left, in one renameat2 exchange). Run here for real on scratch directories, with real venvs
and a real wheel from the engine lock (the router's own wheels are for Debian 13's Python;
the mechanism does not depend on which package the venv holds): killed with SIGKILL after
every statement of the swap, and at points spread over the whole command; after each kill
`venv/bin/python` imports the package (the router would start), and a later full run
converges to the new environment and prunes the leftovers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from control.engine_lock import fetch, load_lock, tools_bin
from roles.fleet import gateway

SHA = "ab" * 32
TOOL = Path(__file__).resolve().parents[2] / "files" / "glm-flash-gateway-launch"
# Runs the tool's swap_venv with a SIGKILL at its Nth executed line (a kill at that point).
KILL_AT_LINE = """
import os, runpy, signal, sys
n, tool, link, target = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
sys.path.insert(0, os.path.dirname(tool))  # as for a script: its own directory (glm_flash_host)
swap_venv = runpy.run_path(tool, run_name="glm_flash_gateway_launch")["swap_venv"]
count = 0
def trace(frame, event, arg):
    global count
    if frame.f_code is swap_venv.__code__ and event == "line":
        count += 1
        if count == n:
            os.kill(os.getpid(), signal.SIGKILL)
    return trace
sys.settrace(trace)
swap_venv(link, target)
"""


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    """A wheelhouse and a hash-locked requirements file of one real pure-Python wheel."""
    _, pins = load_lock("0.7.0.post1")
    pin = next(p for p in pins if p.name == "idna")
    d = tmp_path_factory.mktemp("gw-wheels")
    (d / "wheelhouse").mkdir()
    for path in fetch([pin], log=lambda *_: None):
        (d / "wheelhouse" / path.name).write_bytes(path.read_bytes())
    hashes = " ".join(f"--hash=sha256:{h}" for h in pin.hashes)
    (d / "gateway.txt").write_text(f"{pin.name}=={pin.version} {hashes}\n")
    return d


@pytest.fixture(scope="module")
def template(wheels, tmp_path_factory):
    """One real venv with the package (unpacked from its wheel; no pip, so copies are cheap), built
    once; copies stand for the old and the next one (a venv is found through its own bin/python,
    so a copy works where it lies)."""
    venv = tmp_path_factory.mktemp("gw-template") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python3.*/site-packages"))
    for wheel in (wheels / "wheelhouse").iterdir():  # a wheel is a zip of site-packages' files
        zipfile.ZipFile(wheel).extractall(site)
    return venv


def copy(src: Path, dest: Path) -> None:
    subprocess.run(["cp", "-a", str(src), str(dest)], check=True)


def works(d: Path) -> bool:
    py = d / "venv" / "bin" / "python"
    return subprocess.run([str(py), "-c", "import idna"], capture_output=True).returncode == 0


def old_style(d: Path, template: Path) -> None:
    """What the older deploy left: `venv` a real directory with the package installed."""
    copy(template, d / "venv")
    (d / "venv" / gateway.MARKER).write_text("0" * 64 + "\n")


def command(d: Path, wheels: Path) -> str:
    uv = str(tools_bin() / "uv")  # the control machine's: the same pinned uv (locks/tools.txt) a host gets
    wheelhouse, lock = str(wheels / "wheelhouse"), str(wheels / "gateway.txt")
    (cmd,) = gateway.venv_commands(str(d), uv, str(TOOL), wheelhouse, lock, SHA)
    return cmd


def homeless(d: Path) -> dict:
    """The environment with HOME a file: uv writes nothing of its own there (no cache, no config)."""
    home = d.parent / f"{d.name}-home-is-a-file"
    home.touch()
    return {**{k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "UV_"))}, "HOME": str(home)}


def converged(d: Path, wheels: Path) -> None:
    subprocess.run(["sh", "-c", command(d, wheels)], check=True, capture_output=True, env=homeless(d))
    assert (d / "venv").is_symlink() and works(d)
    assert (d / "venv" / gateway.MARKER).read_text() == SHA + "\n"
    assert not (d / "venv.link").exists() and len(list((d / "venvs").iterdir())) <= 2


@pytest.mark.parametrize("first", [True, False], ids=["from-a-real-directory", "from-a-link"])
def test_a_kill_at_every_statement_of_the_swap_leaves_a_working_venv(tmp_path, wheels, template, first):
    base = tmp_path / "base"
    base.mkdir()
    old_style(base, template)
    if not first:
        converged(base, wheels)  # venv -> venvs/<sha>-X: the next swap replaces a link
    new = base / "venvs" / "next-000000"
    new.parent.mkdir(exist_ok=True)
    copy(template, new)
    line, finished = 0, False
    while not finished:
        line += 1
        assert line < 100
        d = tmp_path / f"kill-{line}"
        subprocess.run(["cp", "-a", str(base), str(d)], check=True)
        r = subprocess.run(
            [sys.executable, "-c", KILL_AT_LINE, str(line), str(TOOL), str(d / "venv"), str(d / "venvs/next-000000")],
            capture_output=True,
            text=True,
        )
        finished = r.returncode == 0
        assert finished or r.returncode == -signal.SIGKILL, r.stderr
        assert works(d), f"killed at line {line} of the swap: no working venv"
        # the swap run again finishes the job from whatever the kill left
        subprocess.run(
            [sys.executable, str(TOOL), "swap-venv", str(d / "venv"), str(d / "venvs/next-000000")], check=True
        )
        assert os.readlink(d / "venv") == "venvs/next-000000" and works(d) and not (d / "venv.link").exists()
        if line > 1:
            subprocess.run(["rm", "-rf", str(d)], check=True)
    assert line > 5  # the kill points did cover the script
    converged(tmp_path / "kill-1", wheels)  # and a whole later run prunes what the first kill left


def test_kills_spread_over_the_whole_replacement_never_leave_it_without_a_venv(tmp_path, wheels, template):
    """Killed 0.5, 1, 2 and 4 s into the whole command (uv venv, uv pip install, sync, swap, prune)."""
    d = tmp_path / "gw"
    d.mkdir()
    old_style(d, template)
    for after in (0.5, 1, 2, 4):
        p = subprocess.Popen(["sh", "-c", command(d, wheels)], start_new_session=True, env=homeless(d))
        try:
            p.wait(timeout=after)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        assert works(d), f"killed {after} s in: no working venv"
    converged(d, wheels)
