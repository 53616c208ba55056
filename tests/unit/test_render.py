"""The unit, environment and launch flags rendered from profiles."""

from pathlib import Path

import jinja2

from control.profile import build
from roles import launch, service

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"


def render(name, **ctx):
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined, keep_trailing_newline=True
    )
    return env.get_template(name).render(**ctx)


def unit(profile, api_key=False):
    return render("glm-flash.service.j2", **service.unit_context(profile, api_key))


def test_unit_runs_unprivileged_and_waits_for_a_completion():
    text = unit(build("gpu1", {}))
    assert "User=glm-flash\n" in text and "Group=glm-flash\n" in text
    assert "ExecStartPre=/opt/glm-flash/bin/glm-flash-preflight gpus 2\n" in text
    assert "ExecStart=/opt/glm-flash/bin/glm-flash-launch /etc/glm-flash/launch.json\n" in text
    assert "glm-flash-ready --port 30000 --model glm-5.3-flash --timeout 3600" in text
    assert "TimeoutStartSec=3660\n" in text and "KillMode=control-group\n" in text
    assert "StartLimitBurst=3\n" in text and "Restart=on-failure\n" in text
    assert "UnsetEnvironment=PYTORCH_ALLOC_CONF PYTORCH_CUDA_ALLOC_CONF\n" in text
    assert "LoadCredential" not in text


def test_unit_with_api_key_and_allocator_setting():
    text = unit(build("gpu1", {"tp_size": 1, "pytorch_alloc_conf": "max_split_size_mb:512"}), api_key=True)
    assert "LoadCredential=api-key:/etc/glm-flash/api-key\n" in text
    assert "UnsetEnvironment" not in text


def test_launch_flags_are_the_field_reports_plus_what_it_omitted():
    p = build("gpu1", {})
    args = launch.kt_args(p, numa_nodes=2)
    pairs = dict(zip(args[::2], args[1::2]))
    assert len(args) == 2 * len(pairs), "every flag takes one value"
    assert pairs["--tp-size"] == "2" and pairs["--kt-method"] == "FP8" and pairs["--kt-cpuinfer"] == "152"
    assert pairs["--kt-max-deferred-experts-per-token"] == "4"
    assert pairs["--kt-gpu-prefill-token-threshold"] == "2048" and pairs["--chunked-prefill-size"] == "32768"
    assert pairs["--max-mamba-cache-size"] == "16" and pairs["--mem-fraction-static"] == "0.55"
    assert pairs["--context-length"] == "524288" and pairs["--kv-cache-dtype"] == "fp8_e4m3"
    assert pairs["--kt-weight-path"] == p.model_path and pairs["--kt-threadpool-count"] == "2"
    assert pairs["--tool-call-parser"] == "glm47" and pairs["--reasoning-parser"] == "glm45"
    assert pairs["--host"] == "127.0.0.1"
    assert "--tp" not in pairs and "--enable-mixed-chunk" not in args


def test_threadpool_count_from_profile_wins_over_numa_fact():
    args = launch.kt_args(build("gpu1", {"kt_threadpool_count": 1}), numa_nodes=4)
    assert args[args.index("--kt-threadpool-count") + 1] == "1"


def test_environment_selects_the_toolkit_by_path_and_transport():
    env = launch.kt_env(build("gpu1", {}))
    assert env["CUDA_HOME"] == "/usr/local/cuda-12.8" and env["PATH"].startswith("/usr/local/cuda-12.8/bin:")
    assert env["SGLANG_KT_GLM5_NEXT_FP8_TRANSPORT"] == "native"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env and "PYTORCH_ALLOC_CONF" not in env
    text = render("glm-flash.env.j2", state_dir="/var/lib/glm-flash", extra_env=env)
    assert "HF_HUB_OFFLINE=1\n" in text and "CUDA_HOME=/usr/local/cuda-12.8\n" in text
