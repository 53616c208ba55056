"""Base state every node must be in, GPU or not."""

import pytest


def test_apt_sources_are_deb822_with_non_free(host, profile):
    f = host.file("/etc/apt/sources.list.d/debian.sources")
    assert f.exists and f.mode == 0o644
    for component in ("main", "contrib", "non-free", "non-free-firmware"):
        assert f" {component}" in f.content_string
    assert profile.apt_mirror in f.content_string
    legacy = host.run("grep -Ev '^[[:space:]]*(#|$)' /etc/apt/sources.list")
    assert legacy.stdout.strip() == "", "an active /etc/apt/sources.list duplicates the deb822 sources"


@pytest.mark.parametrize("package", ["python3", "ca-certificates", "build-essential", "curl"])
def test_base_packages(host, package):
    assert host.package(package).is_installed


def test_service_user_is_unprivileged(host, profile):
    user = host.user(profile.service_user)
    assert user.exists
    assert user.uid != 0 and user.uid < 1000, "a system account"
    assert user.shell in ("/usr/sbin/nologin", "/bin/false")
    assert {"video", "render"} <= set(user.groups)


def test_boots_headless(host, profile):
    if not profile.headless:
        pytest.skip("not applicable: headless is off in the profile")
    assert host.run("systemctl get-default").stdout.strip() == "multi-user.target"
    for dm in profile.display_managers:
        unit = host.service(dm)
        if host.run(f"systemctl cat {dm}.service").rc == 0:
            assert not unit.is_running and not unit.is_enabled, f"{dm} must be stopped and disabled"


@pytest.mark.gpu
def test_no_desktop_process_holds_gpu_memory(host):
    out = host.check_output("nvidia-smi -q -d PIDS")
    kinds = [line.split(":", 1)[1].strip() for line in out.splitlines() if line.strip().startswith("Type")]
    assert not [k for k in kinds if "G" in k], f"graphics processes on the GPU:\n{out}"


@pytest.mark.parametrize(
    "tool", ["glm-flash-patch", "glm-flash-launch", "glm-flash-preflight", "glm-flash-ready", "glm-flash-job"]
)
def test_host_tools_installed(host, profile, tool):
    f = host.file(f"{profile.install_root}/bin/{tool}")
    assert f.exists and f.user == "root" and f.mode == 0o755
    assert host.file(f"/usr/local/sbin/{tool}").linked_to == f"{profile.install_root}/bin/{tool}"
