"""Operations of the CUDA toolkit role (roles/toolkit.py): installed from NVIDIA's repository
or runfile, or checked where the OS ships it; each decides from facts read when it runs."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import OperationError, QuoteString, StringCommand, operation
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import FileContents

from pyinfra_ext import memo
from pyinfra_ext.refusal import refusing
from roles.facts import flags
from roles.facts.driver import AptVersions
from roles.facts.system import CudaToolkits
from roles.operations.driver import DRIVER_PACKAGE_RE
from roles.operations.packages import UPDATE as APT_UPDATE
from roles.operations.packages import apt_install


def toolkit_package(cuda_version: str) -> str:
    """The toolkit's package; cuda_version is one of the knob's choices (control/defaults.py)."""
    return "cuda-toolkit-" + cuda_version.replace(".", "-")


RUNFILE_MARKER = ".glm-flash-runfile"
# The runfile's own installer (cuda-installer) links libxml2.so.2, which a minimal Debian 13
# lacks: "error while loading shared libraries: libxml2.so.2" on debian:13 (spack/spack-packages
# issue 5969; docs/sources.md §7). Installed before the runfile runs.
RUNFILE_NEEDS = ("libxml2",)


@operation()
def toolkit_installed(cuda_version: str, tool: str, runfile_url: str, runfile_sha256: str):
    """
    `cuda-toolkit-X-Y` from the repository, refusing any plan that would change a driver
    package; NVIDIA's runfile, toolkit only, where the repository does not carry it.

    + cuda_version: the toolkit's version, like 12.8
    + tool: glm-flash-nvidia-repo on the host (installs the runfile)
    + runfile_url: NVIDIA's runfile for that version
    + runfile_sha256: the runfile's sha256; another file is refused and deleted
    """
    package = toolkit_package(cuda_version)
    path = f"/usr/local/cuda-{cuda_version}"
    if memo.fact(host, DebPackages).get(package):
        host.noop(f"{package} is installed")
        return
    marker = memo.fact(host, FileContents, path=f"{path}/{RUNFILE_MARKER}")
    if marker and marker[0].strip() == runfile_sha256:
        host.noop(f"CUDA {cuda_version} at {path} from {runfile_url.rsplit('/', 1)[-1]}")
        return
    if not memo.fact(host, AptVersions, package=package):
        installed = memo.fact(host, DebPackages)
        needs = [p for p in RUNFILE_NEEDS if not installed.get(p)]
        if needs:
            yield APT_UPDATE
            yield apt_install(needs)
        options = flags(url=runfile_url, sha256=runfile_sha256, toolkitpath=path)
        yield StringCommand(QuoteString(tool), "runfile", *options)
        return
    yield APT_UPDATE
    # The driver pattern is the one the driver role pins and holds.
    yield StringCommand(
        "plan=$(apt-get -s install --no-install-recommends",
        QuoteString(package),
        "| awk '/^(Inst|Remv) /{print $2}') &&",
        "bad=$(printf '%s\\n' \"$plan\" | grep -E",
        QuoteString(DRIVER_PACKAGE_RE.pattern),
        "|| true) &&",
        "if [ -n \"$bad\" ]; then echo \"glm-flash:",
        package,
        "would change driver packages:\" $bad >&2; exit 1; fi",
    )
    yield apt_install([package])
    nvcc = f"{path}/bin/nvcc"
    yield StringCommand("test -x", nvcc, "|| { echo \"glm-flash:", package, "installed no", nvcc, "\" >&2; exit 1; }")


@operation()
@refusing  # no toolkit fails this host only
def toolkit_present(cuda_version: str):
    """
    The toolkit a host ships with (GB10: DGX OS) is there: a check, never a command.

    + cuda_version: the version that must be under /usr/local/cuda-<version>
    """
    found = memo.fact(host, CudaToolkits)
    if cuda_version in found:
        host.noop(f"CUDA {cuda_version} at {found[cuda_version]}")
        return
    have = ", ".join(f"{v} ({p})" for v, p in sorted(found.items())) or "none"
    raise OperationError(
        f"{host.name}: cuda_version: no CUDA {cuda_version} under /usr/local/cuda-{cuda_version} "
        f"(found: {have}). Fix: install it, or set cuda_version to an installed one"
    )
    yield  # pragma: no cover (a generator)
