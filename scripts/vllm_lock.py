#!/usr/bin/env python3
"""Hash-lock what the GB10 build installs (`make vllm-lock INVENTORY=inventory/gb10.py`).

For the vllm_repo_url / vllm_ref / vllm_torch_index_url of each GB10 host: the fork is fetched
at that commit, its build and CUDA requirements (requirements/build.txt, requirements/cuda.txt
and what they include) are resolved for CPython python_version on aarch64 manylinux_2_35 by
the uv pinned in locks/tools.txt, with the sha256 of every file, and written to
locks/vllm/<ref>.json as {"repo", "ref", "indexes": {url: ["name==version --hash=..."]}}.
Only the torch family (TORCH_INDEX_ONLY) comes from the torch index (an explicit index in
uv's terms: no other name is looked up there); every other name from PyPI alone. The host
tool (files/glm-flash-vllm-build) installs each index's pins from that index only,
--require-hashes --no-deps. Needs the fork's repository, PyPI and the torch index.
"""

from __future__ import annotations

import json
import re
import runpy
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from control.engine_lock import tools_bin  # noqa: E402
from control.profile import build  # noqa: E402

LOCK_DIR = REPO / "locks" / "vllm"
PYPI = "https://pypi.org/simple"
TORCH_INDEX_ONLY = ("torch", "torchvision", "torchaudio")
REQUIREMENTS = ("requirements/build.txt", "requirements/cuda.txt")


def requirement_lines(src: Path, rel: str, seen: set) -> list[str]:
    """Requirement specifiers of a pip requirements file, following -r includes."""
    path = (src / rel).resolve()
    if path in seen or not path.is_file():
        return []
    seen.add(path)
    out = []
    for raw in path.read_text().splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith(("-r ", "--requirement ")):
            out += requirement_lines(path.parent, line.split(None, 1)[1], seen)
        elif not line.startswith("-"):  # index options of the fork are not ours to follow
            out.append(line)
    return out


def pyproject(deps: list[str], torch_index: str, python: str) -> str:
    sources = "\n".join(f'{name} = {{ index = "torch" }}' for name in TORCH_INDEX_ONLY)
    return (
        '[project]\nname = "glm-flash-vllm-build-deps"\nversion = "0"\n'
        f'requires-python = ">={python}"\ndependencies = {json.dumps(deps)}\n\n'
        f"[tool.uv.sources]\n{sources}\n\n"
        f'[[tool.uv.index]]\nname = "torch"\nurl = "{torch_index}"\nexplicit = true\n'
    )


def parse_compiled(text: str, torch_index: str) -> dict[str, list[str]]:
    """uv's output (hashes, index annotations) as {index: [pin lines]}."""
    indexes: dict[str, list[str]] = {PYPI: [], torch_index: []}
    pin, where = None, PYPI
    for line in text.replace("\\\n", " ").splitlines() + [""]:
        stripped = line.strip()
        m = re.match(r"#\s*from\s+(\S+)", stripped)
        if m:
            where = m.group(1).rstrip("/") + "/" if m.group(1).rstrip("/") + "/" == torch_index else PYPI
        elif not stripped.startswith("#"):
            if pin:
                indexes[where].append(pin)
            pin, where = (" ".join(stripped.split()) or None), PYPI
    return {url: sorted(pins) for url, pins in indexes.items() if pins}


def lock(repo: str, ref: str, torch_index: str, python: str) -> dict:
    torch_index = torch_index.rstrip("/") + "/"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        subprocess.run(["git", "init", "-q", str(src)], check=True)
        subprocess.run(["git", "-C", str(src), "fetch", "-q", "--depth", "1", repo, ref], check=True)
        subprocess.run(["git", "-C", str(src), "checkout", "-q", "FETCH_HEAD"], check=True)
        seen: set = set()
        deps = [line for rel in REQUIREMENTS for line in requirement_lines(src, rel, seen)]
        if not deps:
            raise SystemExit(f"{repo}@{ref}: no {' or '.join(REQUIREMENTS)}; is it a vLLM tree?")
        project = Path(tmp) / "deps"
        project.mkdir()
        (project / "pyproject.toml").write_text(pyproject(deps, torch_index, python))
        out = subprocess.run(
            [
                str(tools_bin() / "uv"),
                "pip",
                "compile",
                str(project / "pyproject.toml"),
                "--python-version",
                python,
                "--python-platform",
                "aarch64-manylinux_2_35",
                "--index-url",
                PYPI,
                "--generate-hashes",
                "--emit-index-annotation",
                "--no-header",
                "--quiet",
            ],
            capture_output=True,
            text=True,
            cwd=project,
        )
        if out.returncode:
            raise SystemExit(f"uv could not resolve {repo}@{ref}: {out.stderr.strip()[-2000:]}")
    return {"repo": repo, "ref": ref, "python": python, "indexes": parse_compiled(out.stdout, torch_index)}


def main(inventory: str) -> int:
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    for name, data in runpy.run_path(inventory)["hosts"]:
        p = build(name, data, api_key_present=False)
        if p.platform != "gb10":
            continue
        path = LOCK_DIR / f"{p.vllm_ref}.json"
        path.write_text(
            json.dumps(lock(p.vllm_repo_url, p.vllm_ref, p.vllm_torch_index_url, p.python_version), indent=1) + "\n"
        )
        print(f"{path.relative_to(REPO)}: {name}'s vLLM-Moet {p.vllm_ref[:12]} locked", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "inventory/gb10.py"))
