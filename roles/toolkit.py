"""CUDA toolkit `cuda_version` side by side under /usr/local/cuda-X.Y, beside the driver.

NVIDIA's `cuda-toolkit-X-Y` package carries the compiler and libraries only (`cuda`
and `cuda-X-Y` would pull the driver). The install is simulated first and refused if
apt would touch a driver package, so a toolkit can never move the driver. The engine
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

from roles import driver
from roles.report import skipped
from roles.facts import CudaToolkits


def toolkit_path(profile) -> str:
    """Install directory of the profile's CUDA toolkit, e.g. /usr/local/cuda-12.8."""
    return f"/usr/local/cuda-{profile.cuda_version}"


def toolkit_env(profile) -> dict[str, str]:
    """Environment that selects the profile's toolkit by path (CUDA_HOME, nvcc on PATH)."""
    path = toolkit_path(profile)
    return {"CUDA_HOME": path, "CUDA_PATH": path, "PATH": f"{path}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}


def toolkit_package(cuda_version: str) -> str:
    if not re.fullmatch(r"\d+\.\d+", cuda_version):
        raise OperationError(f"cuda_version: {cuda_version!r} is not like '12.8'")
    return "cuda-toolkit-" + cuda_version.replace(".", "-")


@operation()
def toolkit_installed(cuda_version: str):
    """`cuda-toolkit-X-Y` installed, refusing any plan that would change a driver package."""
    package = toolkit_package(cuda_version)
    if host.get_fact(DebPackages).get(package):
        host.noop(f"{package} is installed")
        return
    yield "apt-get update"
    # The driver pattern is the one the driver role pins and holds.
    yield StringCommand(
        "plan=$(apt-get -s install --no-install-recommends", QuoteString(package),
        "| awk '/^(Inst|Remv) /{print $2}') &&",
        "bad=$(printf '%s\\n' \"$plan\" | grep -E", QuoteString(driver.DRIVER_PACKAGE_RE.pattern), "|| true) &&",
        "if [ -n \"$bad\" ]; then echo \"glm-flash:", package,
        "would change driver packages:\" $bad >&2; exit 1; fi",
    )
    yield StringCommand(noninteractive_apt("install --no-install-recommends"), QuoteString(package))
    nvcc = f"/usr/local/cuda-{cuda_version}/bin/nvcc"
    yield StringCommand("test -x", nvcc, "|| { echo \"glm-flash:", package, "installed no", nvcc, "\" >&2; exit 1; }")


@operation()
def toolkit_present(cuda_version: str):
    """The toolkit a host ships with (GB10: DGX OS) is there."""
    found = host.get_fact(CudaToolkits)
    if cuda_version in found:
        host.noop(f"CUDA {cuda_version} at {found[cuda_version]}")
        return
    have = ", ".join(f"{v} ({p})" for v, p in sorted(found.items())) or "none"
    raise OperationError(f"{host.name}: cuda_version: no CUDA {cuda_version} under /usr/local/cuda-{cuda_version} "
                         f"(found: {have}). Fix: install it, or set cuda_version to an installed one")
    yield  # pragma: no cover (a generator)


def apply(profile) -> None:
    if not driver.gpu_present(profile):
        skipped(f"CUDA {profile.cuda_version} toolkit from NVIDIA's repository",
                "no NVIDIA GPU on this host and require_gpu is false")
        return
    if profile.driver_source == "nvidia-repo":
        # Same operation as the driver role's; it yields nothing once the repository is there.
        driver.nvidia_repository(name="NVIDIA CUDA apt repository (toolkit)", repo_url=profile.nvidia_repo_url,
                                 key_url=profile.nvidia_repo_key_url)
        toolkit_installed(name=f"CUDA {profile.cuda_version} toolkit", cuda_version=profile.cuda_version)
    else:
        toolkit_present(name=f"CUDA {profile.cuda_version} at {toolkit_path(profile)}", cuda_version=profile.cuda_version)
