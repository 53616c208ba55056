"""CUDA toolkit `cuda_version` side by side under /usr/local/cuda-X.Y, beside the driver.

From NVIDIA's repository when it carries `cuda-toolkit-X-Y` (the compiler and libraries
only: `cuda` and `cuda-X-Y` would pull the driver); the install is simulated first and
refused if apt would touch a driver package, so a toolkit can never move the driver.
NVIDIA's debian13 repository has no 12.x toolkit (docs/sources.md §7): then NVIDIA's
runfile (`cuda_runfile_url`, checked against `cuda_runfile_sha256` before it runs) installs
the toolkit alone (`--toolkit --toolkitpath`, never the driver). A runfile tree has no dpkg
hook: the header fix is re-checked by every deploy (roles/cuda_header.py). The engine
finds the toolkit by path (`toolkit_path`, `toolkit_env`), never through the
/usr/local/cuda link, which other toolkits' packages move.

On `preinstalled` hosts (GB10, DGX OS) the toolkit comes with the OS: it is checked,
not installed.
"""

from __future__ import annotations

import re

from pyinfra import host
from pyinfra.api import OperationError, QuoteString, StringCommand, operation
from pyinfra.facts.apt import noninteractive_apt
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import FileContents

from control.report import skipped
from roles import driver
from roles.facts.driver import AptVersions
from roles.facts.system import CudaToolkits
from roles.operations.refusal import refusing


def toolkit_path(profile) -> str:
    """Install directory of the profile's CUDA toolkit, e.g. /usr/local/cuda-12.8."""
    return f"/usr/local/cuda-{profile.cuda_version}"


def toolkit_env(profile) -> dict[str, str]:
    """Environment that selects the profile's toolkit by path (CUDA_HOME, nvcc on PATH)."""
    path = toolkit_path(profile)
    return {
        "CUDA_HOME": path,
        "CUDA_PATH": path,
        "PATH": f"{path}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    }


def toolkit_package(cuda_version: str) -> str:
    if not re.fullmatch(r"\d+\.\d+", cuda_version):
        raise OperationError(f"cuda_version: {cuda_version!r} is not like '12.8'")
    return "cuda-toolkit-" + cuda_version.replace(".", "-")


RUNFILE_MARKER = ".glm-flash-runfile"


@operation()
def toolkit_installed(cuda_version: str, tool: str, runfile_url: str, runfile_sha256: str):
    """`cuda-toolkit-X-Y` from the repository, refusing any plan that would change a driver
    package; NVIDIA's runfile, toolkit only, where the repository does not carry it."""
    package = toolkit_package(cuda_version)
    path = f"/usr/local/cuda-{cuda_version}"
    if host.get_fact(DebPackages).get(package):
        host.noop(f"{package} is installed")
        return
    marker = host.get_fact(FileContents, path=f"{path}/{RUNFILE_MARKER}")
    if marker and marker[0].strip() == runfile_sha256:
        host.noop(f"CUDA {cuda_version} at {path} from {runfile_url.rsplit('/', 1)[-1]}")
        return
    if not host.get_fact(AptVersions, package=package):
        yield StringCommand(
            QuoteString(tool),
            "runfile",
            "--url",
            QuoteString(runfile_url),
            "--sha256",
            QuoteString(runfile_sha256),
            "--toolkitpath",
            QuoteString(path),
        )
        return
    yield "apt-get update"
    # The driver pattern is the one the driver role pins and holds.
    yield StringCommand(
        "plan=$(apt-get -s install --no-install-recommends",
        QuoteString(package),
        "| awk '/^(Inst|Remv) /{print $2}') &&",
        "bad=$(printf '%s\\n' \"$plan\" | grep -E",
        QuoteString(driver.DRIVER_PACKAGE_RE.pattern),
        "|| true) &&",
        "if [ -n \"$bad\" ]; then echo \"glm-flash:",
        package,
        "would change driver packages:\" $bad >&2; exit 1; fi",
    )
    yield StringCommand(noninteractive_apt("install --no-install-recommends"), QuoteString(package))
    nvcc = f"{path}/bin/nvcc"
    yield StringCommand("test -x", nvcc, "|| { echo \"glm-flash:", package, "installed no", nvcc, "\" >&2; exit 1; }")


@operation()
@refusing  # no toolkit fails this host only
def toolkit_present(cuda_version: str):
    """The toolkit a host ships with (GB10: DGX OS) is there."""
    found = host.get_fact(CudaToolkits)
    if cuda_version in found:
        host.noop(f"CUDA {cuda_version} at {found[cuda_version]}")
        return
    have = ", ".join(f"{v} ({p})" for v, p in sorted(found.items())) or "none"
    raise OperationError(
        f"{host.name}: cuda_version: no CUDA {cuda_version} under /usr/local/cuda-{cuda_version} "
        f"(found: {have}). Fix: install it, or set cuda_version to an installed one"
    )
    yield  # pragma: no cover (a generator)


def apply(profile, bin_dir: str) -> None:
    if profile.driver_source == "nvidia-repo":
        # After the driver role: the repository is configured and its key checked.
        toolkit_installed(
            name=f"CUDA {profile.cuda_version} toolkit at {toolkit_path(profile)}",
            cuda_version=profile.cuda_version,
            tool=f"{bin_dir}/{driver.REPO_TOOL}",
            runfile_url=profile.cuda_runfile_url,
            runfile_sha256=profile.cuda_runfile_sha256,
        )
    elif driver.gpu_present(profile):
        toolkit_present(
            name=f"CUDA {profile.cuda_version} at {toolkit_path(profile)}", cuda_version=profile.cuda_version
        )
    else:
        skipped(f"CUDA {profile.cuda_version} toolkit check", "no NVIDIA GPU on this host and require_gpu is false")
