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

from control import layout
from control.report import skipped
from roles import driver
from roles.operations.toolkit import toolkit_installed, toolkit_present


def toolkit_path(profile) -> str:
    """Install directory of the profile's CUDA toolkit, e.g. /usr/local/cuda-12.8."""
    return f"/usr/local/cuda-{profile.cuda_version}"


def toolkit_env(profile) -> dict[str, str]:
    """Environment that selects the profile's toolkit by path (CUDA_HOME, nvcc on PATH), with
    the engine environment's own bin/ first, as activating it would: the engines' JIT builds run
    tools by name (flashinfer and tvm-ffi run `ninja`, the pip one installed there), and the
    launcher execs the environment's python without activating it."""
    path = toolkit_path(profile)
    return {
        "CUDA_HOME": path,
        "CUDA_PATH": path,
        "PATH": f"{layout.engine_bin(profile)}:{path}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    }


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
