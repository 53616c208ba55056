"""The GB10 box as deployed (platform gb10): GPU and driver, the fork at the pinned commit,
our patch, the drafter, the unit, a real completion, and the default thinking budget.

    pytest tests/host --inventory inventory/gb10.py --hosts ssh://root@gx10.example.lan

Skipped, with the reason, for every other profile (the sandbox and the L40S box).
"""

from __future__ import annotations

import json
import shlex

import pytest

from control import layout
from roles.engines.vllm import engine as engine_vllm
from roles.engines.vllm import launch as vllm_launch
from roles.facts.driver import version_at_least
from roles.facts.gb10 import GB10_CAPABILITY
from tests.host.test_service import _flag_values as _given  # one parser of launch.json's flags


@pytest.fixture(scope="module", autouse=True)
def _gb10_only(profile):
    # module scope: decided before the function-scoped GPU marker reaches for the host
    if profile.platform != "gb10":
        pytest.skip(f"not applicable: GB10 checks, this host's profile is platform {profile.platform}")


@pytest.fixture
def env_dir(profile) -> str:
    return f"{layout.engine_root(profile)}/envs/{engine_vllm.env_id(profile)}"


def asked_at(profile) -> str:
    """Where the engine is asked: where it listens (listen_host), loopback for a wildcard."""
    where = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(profile.listen_host, profile.listen_host)
    return f"[{where}]" if ":" in where else where


def api(host, profile, path: str, body: dict) -> dict:
    """POST to the engine where it listens, with the API key when one is configured."""
    key = (
        "-H \"Authorization: Bearer $(cat /etc/glm-flash/api-key)\""
        if host.file("/etc/glm-flash/api-key").exists
        else ""
    )
    out = host.check_output(
        f"curl -sS --max-time 900 -H 'Content-Type: application/json' {key} "
        f"-d {shlex.quote(json.dumps(body))} http://{asked_at(profile)}:{profile.port}{path}"
    )
    return json.loads(out)


@pytest.mark.gpu
def test_gpu_is_a_gb10_with_unified_memory_and_a_new_enough_driver(host, profile):
    rows = host.check_output(
        "nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader,nounits"
    ).splitlines()
    assert len(rows) == 1, rows
    name, cap, memory, driver = [c.strip() for c in rows[0].split(",")]
    assert "GB10" in name and cap == GB10_CAPABILITY
    assert not memory.isdigit(), f"a GB10 reports no memory of its own, got {memory}"
    assert version_at_least(driver, profile.driver_min_version), f"driver {driver} < {profile.driver_min_version}"
    assert host.check_output("uname -m") == "aarch64"


def test_engine_is_the_fork_at_the_pinned_commit(host, profile, env_dir):
    current = host.check_output(f"readlink {layout.engine_root(profile)}/current")
    assert current.rstrip("/").endswith(f"envs/{engine_vllm.env_id(profile)}")
    marker = json.loads(host.file(f"{env_dir}/.glm-flash-complete").content_string)
    assert (marker["fork_repo"], marker["fork_commit"]) == (profile.vllm_repo_url, profile.vllm_ref)
    assert marker["vllm"] == profile.vllm_version
    assert host.check_output(f"git -C {env_dir}/fork rev-parse HEAD") == profile.vllm_ref
    version = host.check_output(
        f"{env_dir}/bin/python -c 'import vllm, torch; print(vllm.__version__, torch.version.cuda)'"
    )
    assert version.split()[1] != "None", f"torch without CUDA in {env_dir}: {version}"


def test_the_lock_cache_is_roots_alone_and_holds_this_lock_only(host, profile):
    """The engine's unpacked wheels (the environments' files are hard links into them): root's, 0700,
    so nothing the service user writes reaches a later build; one lock's set, the serving one's."""
    top = f"{layout.engine_root(profile)}/uv-cache"
    cache = host.file(top)
    assert (cache.is_directory, cache.user, cache.group, cache.mode) == (True, "root", "root", 0o700)
    lock = host.check_output(f"sha256sum {layout.engine_root(profile)}/locks/{engine_vllm.env_id(profile)}.vllm.txt")
    assert host.check_output(f"ls {top}").split() == [lock.split()[0]]


def test_deepgemm_is_the_pinned_commit(host, profile, env_dir):
    """DeepGEMM built from deepgemm_ref into the serving environment (the fork's Dockerfile's swap):
    recorded, its checkout at that commit, one deep_gemm installed whose version's +<rev> names it."""
    marker = json.loads(host.file(f"{env_dir}/.glm-flash-complete").content_string)
    assert (marker["deepgemm_repo"], marker["deepgemm_commit"]) == (profile.deepgemm_repo_url, profile.deepgemm_ref)
    assert host.check_output(f"git -C {env_dir}/deepgemm rev-parse HEAD") == profile.deepgemm_ref
    site = f"{env_dir}/lib/python{profile.python_version}/site-packages"
    dists = host.check_output(f"cd {site} && ls -d deep_gemm-*.dist-info").split()
    assert dists == [f"deep_gemm-{marker['deep_gemm']}.dist-info"], dists
    local = marker["deep_gemm"].partition("+")[2]
    assert not local or profile.deepgemm_ref.startswith(local), marker["deep_gemm"]
    assert host.file(f"{site}/deep_gemm/__init__.py").exists


def test_fork_patch_is_applied_as_recorded(host, profile, env_dir):
    """The fork's patch series is in place (it reverses, last first) and no patched file changed since."""
    site = layout.site_packages(profile, env_dir)
    patches = [f"{env_dir}/fork/{rel}" for rel in profile.fork_patches]
    series = " ".join(f"--patch {p}" for p in patches)
    out = host.run(f"python3 {profile.install_root}/bin/glm-flash-fork-patch check --site {site} {series}")
    assert out.rc == 0, out.stdout + out.stderr
    record = json.loads(host.file(f"{env_dir}/glm-flash-fork-patch.json").content_string)
    assert record["fork_commit"] == profile.vllm_ref
    assert [p["path"] for p in record["patches"]] == profile.fork_patches
    assert [p["sha256"] for p in record["patches"]] == [host.check_output(f"sha256sum {p}").split()[0] for p in patches]
    for rel, digest in record["files"].items():
        assert host.check_output(f"sha256sum {site}/{rel}").split()[0] == digest, f"{rel} changed since it was patched"


def test_scheduler_fix_is_in_the_patched_scheduler(host, profile, env_dir):
    """The Mamba-block fix of the field report ships in the fork's patch: checked, never patched again."""
    site = layout.site_packages(profile, env_dir)
    override = profile.scheduler_fix_verified_ref
    flags = f" --verified-ref {override} --commit {profile.vllm_ref}" if override else ""
    out = host.run(f"python3 {profile.install_root}/bin/glm-flash-fork-patch scheduler-fix --site {site}{flags}")
    assert out.rc == 0, out.stdout + out.stderr


def test_fork_kernels_are_where_the_service_looks(host, profile, env_dir):
    out = host.run(f"python3 {profile.install_root}/bin/glm-flash-fork-patch kernels --dir {env_dir}/cubit-share")
    assert out.rc == 0, out.stdout + out.stderr
    env = host.file("/etc/glm-flash/glm-flash.env").content_string.splitlines()
    assert f"VLLM_MOE_W2_CUBIT_DIR={layout.engine_root(profile)}/current/cubit-share" in env


def test_drafter_is_downloaded_and_verified(host, profile):
    out = host.run(
        f"python3 {profile.install_root}/bin/glm-flash-model-fetch check --dest {profile.drafter_path} "
        f"--repo {profile.drafter_model} --revision {profile.drafter_revision}"
    )
    assert out.rc == 0, out.stdout + out.stderr


def test_thinking_budget_default_is_wired(host, profile, env_dir):
    spec = json.loads(host.file("/etc/glm-flash/launch.json").content_string)
    assert vllm_launch.MIDDLEWARE in spec["args"]
    env = host.file("/etc/glm-flash/glm-flash.env").content_string
    assert f"{vllm_launch.BUDGET_ENV}={profile.thinking_token_budget}" in env.splitlines()
    assert host.file(f"{env_dir}/lib/python{profile.python_version}/site-packages/glm_flash_defaults.py").exists


# The GB10 field report (docs/sources.md §1), written here literally: the repo's profile defaults are
# supposed to reproduce these, so they are not read from the repo. Each: (flag, the report's value, the
# inventory knob that may override it). Values the report does not state (memory utilisation, the
# load strategy, the cache mode) come from docs/sources.md §8 and are checked by the engine's parser.
GB10_REPORT_FLAGS = [
    ("--max-model-len", "204800", "max_model_len"),  # "context 200K (204,800 tokens)"
    ("--max-num-seqs", "1", "max_num_seqs"),  # "DFlash2 k=7 leaves room for one long stream at a time"
    ("--tensor-parallel-size", "1", "tp_size"),  # one GB10
]
GB10_REPORT_SPECULATION = ("dflash", 7)  # "DFlash2 k=7": the DFlash2 drafter, 7 speculative tokens
GB10_REPORT_EFFORT = "low"  # "reasoning_effort low", the server default
GB10_REPORT_BUDGET = 1536  # "capping thinking with thinking_token_budget (1536 works well for coding)"


@pytest.fixture(scope="module")
def launch(host) -> dict:
    return json.loads(host.file("/etc/glm-flash/launch.json").content_string)


def test_launch_flags_are_the_field_reports(host, launch, profile, inventory_data):
    """The host's launch.json against the GB10 field report (and the inventory's literal overrides),
    not against the code that wrote it."""
    _, data = inventory_data
    assert launch["module"] == "vllm.entrypoints.openai.api_server"
    assert launch["python"] == f"{layout.engine_root(profile)}/current/bin/python"
    given = _given(launch["args"])
    for flag, value, knob in GB10_REPORT_FLAGS:
        want = str(data.get(knob, value))
        assert given.get(flag) == want, f"{flag} {given.get(flag)!r} in launch.json, the report says {want}"
    assert "--enable-prefix-caching" in given  # the report's long agent sessions run on vLLM's prefix cache
    spec = json.loads(given["--speculative-config"])
    method, k = GB10_REPORT_SPECULATION
    assert (spec["method"], spec["num_speculative_tokens"]) == (method, data.get("num_speculative_tokens", k))
    assert spec["model"] == profile.drafter_path and host.file(spec["model"]).is_directory
    effort = json.loads(given["--default-chat-template-kwargs"])["reasoning_effort"]
    assert effort == data.get("reasoning_effort", GB10_REPORT_EFFORT)
    env = host.file("/etc/glm-flash/glm-flash.env").content_string.splitlines()
    budget = data.get("thinking_token_budget", GB10_REPORT_BUDGET)
    assert f"{vllm_launch.BUDGET_ENV}={budget}" in env
    assert "--api-key" not in launch["args"], "the key is added by the launcher, never written in the flags"


def test_the_patched_engine_reads_the_fork_settings_of_the_unit(host, launch, profile, env_dir):
    """The host's own launch.json and unit environment, through the patched engine's own parser."""
    env = host.file("/etc/glm-flash/glm-flash.env").content_string.splitlines()
    names = sorted(line.partition("=")[0] for line in env if line.startswith("VLLM_"))
    assert names, "the unit sets none of the fork's VLLM_ settings"
    check = {k: launch[k] for k in ("module", "args", "api_key_flag")} | {"env": names}
    out = host.run(
        f"{env_dir}/bin/python {profile.install_root}/bin/glm-flash-check-flags --args-json {shlex.quote(json.dumps(check))}"
    )
    assert out.rc == 0, out.stdout + out.stderr


def test_memory_guard_acts_on_available_memory(host, profile):
    """earlyoom runs with the deploy's command line, and the engine is its first choice."""
    if not profile.memory_guard_gib:
        pytest.skip("not applicable: memory_guard_gib is 0 in this host's profile")
    assert host.service("earlyoom.service").is_running and host.service("earlyoom.service").is_enabled
    cmdline = host.run("cat /proc/$(systemctl show -p MainPID --value earlyoom.service)/cmdline").stdout.split("\0")
    term = int(profile.memory_guard_gib * 1024 * 1024)
    assert cmdline[1:5] == ["-M", f"{term},{term // 2}", "-s", "100,100"], cmdline
    assert host.run("systemctl show -p OOMScoreAdjust --value glm-flash.service").stdout.strip() == "1000"


@pytest.mark.gpu
def test_unit_is_active(host):
    assert host.run("systemctl is-active glm-flash.service").stdout.strip() == "active"


@pytest.mark.gpu
def test_a_completion_answers(host, profile):
    out = host.run(
        f"{profile.install_root}/bin/glm-flash-ready --host {profile.listen_host} --port {profile.port} "
        f"--model {profile.served_model_name} --once"
    )  # a real answer, asked where the engine listens
    assert out.rc == 0, out.stderr


@pytest.mark.gpu
def test_a_request_without_a_budget_thinks_within_the_default(host, profile):
    """A prompt that makes the model think long, no thinking_token_budget, effort max: the
    reasoning must stop at the server default (counted with the engine's own tokenizer)."""
    reply = api(
        host,
        profile,
        "/v1/chat/completions",
        {
            "model": profile.served_model_name,
            "max_tokens": profile.thinking_token_budget + 1024,
            "temperature": 0,
            "chat_template_kwargs": {"reasoning_effort": "max"},
            "messages": [
                {
                    "role": "user",
                    "content": "Prove carefully, step by step, that there are infinitely many "
                    "primes of the form 4k+3, then list the first 40 of them with a check for each.",
                }
            ],
        },
    )
    message = reply["choices"][0]["message"]
    reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
    assert reasoning, f"no reasoning in the reply: {json.dumps(reply)[:500]}"
    count = api(
        host,
        profile,
        "/tokenize",
        {"model": profile.served_model_name, "prompt": reasoning, "add_special_tokens": False},
    )["count"]
    assert count <= profile.thinking_token_budget + 16, (
        f"{count} reasoning tokens, default budget {profile.thinking_token_budget}"
    )
