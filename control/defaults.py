"""Every knob a host can set, with its default and why.

Defaults are the best measured configuration of the L40S field report
(docs/sources.md §1: 2x L40S + EPYC 9845). `PLATFORMS` overlays what differs on
the GB10 box (docs/sources.md §1). An inventory sets only what differs again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class On:
    """Bounds or choices that hold on one platform only (the GB10 box has one GPU, ...)."""

    why: str
    choices: tuple = ()
    low: float | None = None
    high: float | None = None


@dataclass(frozen=True)
class Knob:
    default: Any
    why: str
    kind: type | tuple = str  # accepted Python type(s)
    choices: tuple = ()  # allowed values, when a closed set
    low: float | None = None  # inclusive bounds for numbers
    high: float | None = None
    optional: bool = False  # None is allowed (and "" for a string with a pattern)
    pattern: str = ""  # regular expression a whole string (or each string of a list) must match
    items: type | None = None  # a list's item type; low and high then bound each item
    shape: str = ""  # what `pattern` means, for the message: "an absolute path ..."
    platforms: dict[str, On] = field(default_factory=dict)  # what differs per platform


# Shapes: every string knob has one (or a closed set of choices). Nothing here lets through
# a space, a quote, `$`, `%`, `\`, `;`, `&`, `|`, a backquote or a control character, so no
# value can add a shell word, a systemd specifier or a line to a unit or env file.
_SEG = r"(?!\.\.?(?:/|$))[A-Za-z0-9._+-]+"  # one path component, not . or ..
_HOST = r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
_URL_PATH = r"(?:/[A-Za-z0-9._~+-]*)*"
HOST_PATH = dict(
    pattern=rf"(?:/{_SEG})+",
    shape="an absolute path of letters, digits and . _ + - (no spaces, quotes, $, %, '..' or trailing /)",
)
LOCAL_PATH = dict(  # on the control machine: ~/ is the user's home
    pattern=rf"~?(?:/{_SEG})+",
    shape="an absolute path (or ~/...) on the control machine, of letters, digits and . _ + - "
    "(no spaces, quotes, $, %, '..' or trailing /)",
)
URL = dict(
    pattern=rf"https?://(?:{_HOST}|\[[0-9A-Fa-f:.]+\])(?::[0-9]{{1,5}})?{_URL_PATH}",
    shape="an http:// or https:// URL of letters, digits and . _ ~ + - / (no spaces, quotes, %, ?, & or @)",
)
KEY_URL = dict(
    pattern=rf"https://(?:{_HOST}|\[[0-9A-Fa-f:.]+\])(?::[0-9]{{1,5}})?{_URL_PATH}|file://(?:/{_SEG})+",
    shape="an https:// URL, or file:///path for a key staged on the host (letters, digits, . _ ~ + - /)",
)
LISTEN = dict(pattern=rf"{_HOST}|[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*", shape="an IP address or a host name")
IP_ADDRESS = dict(
    pattern=r"(?:[0-9]{1,3}\.){3}[0-9]{1,3}|[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*",
    shape="an IP address (IPv4 dotted, or IPv6), not a host name",
)
# An IP address or network (CIDR); control/rules.py also parses each with ipaddress.
IP_NET = dict(
    pattern=r"[0-9]{1,3}(?:\.[0-9]{1,3}){3}(?:/[0-9]{1,2})?|[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*(?:/[0-9]{1,3})?",
    shape="an IPv4 or IPv6 address, or a network in CIDR form (10.0.0.0/24)",
)
REF = dict(  # git check-ref-format, narrowed: also the Hugging Face hub's revisions
    pattern=r"(?![-/.])(?!.*\.\.)(?!.*//)(?!.*/\.)(?!.*\.lock(?:/|$))[A-Za-z0-9._/-]+(?<![./])",
    shape="a git branch, tag or commit (letters, digits and . _ / -; no '..', no leading - or .)",
)
COMMIT = dict(pattern=r"[0-9a-f]{40}", shape="a full commit hash (40 lowercase hex digits; a branch or tag moves)")
HF_REPO = dict(
    pattern=r"(?!.*(?:--|\.\.))[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
    r"/[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?",
    shape="a Hugging Face repository id, owner/name (letters, digits, . _ -)",
)
VERSION = dict(pattern=r"[0-9]+(?:\.[0-9]+)+", shape="a version of numbers and dots")
PEP440 = dict(
    pattern=r"[0-9]+(?:\.[0-9]+)*(?:(?:a|b|rc)[0-9]+)?(?:\.post[0-9]+)?(?:\.dev[0-9]+)?",
    shape="a release version (numbers and dots)",
)
DEB_PACKAGE = dict(pattern=r"[a-z0-9][a-z0-9+.-]+", shape="a Debian package name (lowercase letters, digits, + . -)")
UNIT_NAME = dict(pattern=r"[A-Za-z0-9][A-Za-z0-9_.@-]*", shape="a systemd unit name (letters, digits, _ . @ -)")
IDENT = dict(pattern=r"[a-z][a-z0-9_]*", shape="a lowercase identifier (letters, digits, _)")
ENV_NAME = dict(pattern=r"[A-Za-z_][A-Za-z0-9_]*", shape="an environment variable name (letters, digits, _)")
UNPRIVILEGED_USER = dict(  # the engine must not run as root
    pattern=r"(?!root$)[a-z][a-z0-9_-]{0,31}",
    shape="a Debian user name (lowercase letters, digits, _ -), not root: the engine must not run as root",
)
MODEL_NAME = dict(pattern=r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}", shape="a model name of letters, digits and . _ : / -")
ALLOC_CONF = dict(
    pattern=r"[a-z_]+:[A-Za-z0-9.]+(?:,[a-z_]+:[A-Za-z0-9.]+)*",
    shape="PyTorch allocator settings, key:value[,key:value] (no spaces)",
)
HEX40 = dict(pattern=r"[0-9A-Fa-f]{40}", shape="a 40-hex-digit OpenPGP fingerprint (no spaces)")
SHA256 = dict(pattern=r"[0-9a-f]{64}", shape="a sha256 (64 lowercase hex digits)")
FORK_PATH = dict(
    pattern=rf"{_SEG}(?:/{_SEG})*",
    shape="a relative path inside the fork's checkout, of letters, digits and . _ + - (no '..', no leading /)",
)


K = Knob
KNOBS: dict[str, Knob] = {
    # --- what the host is -----------------------------------------------------------
    "platform": K(
        "l40s",
        "picks the engine and the platform defaults below; cpu: the sandbox's vLLM on the CPU with a tiny "
        "model (refused where require_gpu is true)",
        choices=("l40s", "gb10", "cpu"),
    ),
    "gpu_count": K(
        2,
        "GPUs the profile expects; the field box has two L40S",
        int,
        low=0,
        high=16,
        platforms={"gb10": On("the GB10 box has one GPU", low=1, high=1)},
    ),
    "gpu_compute_capability": K(
        "8.9",
        "sm_89 is Ada (L40S); the patches below depend on it",
        choices=("8.6", "8.9", "9.0", "10.0", "12.0", "12.1"),
        platforms={
            "l40s": On(
                "sglang-kt's GLM-5 config rejects sm_90 (Hopper); sm_121 is the GB10's own GPU",
                choices=("8.6", "8.9", "10.0", "12.0"),
            ),
            "gb10": On("the GB10's GPU is sm_121", choices=("12.1",)),
        },
    ),
    "require_gpu": K(True, "a real node must have its GPUs; the sandbox sets False to skip GPU steps", bool),
    # --- operating system -----------------------------------------------------------
    "apt_mirror": K("http://deb.debian.org/debian", "Debian mirror; point at a local one for air-gapped hosts", **URL),
    "apt_security_mirror": K("http://deb.debian.org/debian-security", "security updates mirror", **URL),
    "debian_suite": K("trixie", "Debian 13 is what the field report ran", choices=("trixie",)),
    "base_packages": K(
        ["ca-certificates", "curl", "python3", "build-essential", "ninja-build", "pciutils", "numactl", "jq"],
        "python3 runs our host tools; build-essential and ninja-build: the engines' JIT kernel compiles "
        "(flashinfer runs `ninja` by name)",
        list,
        **DEB_PACKAGE,
    ),
    "headless": K(
        True, "a desktop session held 0.5-0.7 GiB on GPU 0 in the field; TP is limited by the fullest card", bool
    ),
    "display_managers": K(
        ["gdm3", "gdm", "sddm", "lightdm", "xdm", "lxdm"], "units stopped and disabled when headless", list, **UNIT_NAME
    ),
    "allow_reboot": K(True, "reboot when a new driver or kernel is installed but not running", bool),
    # --- uninstall.py (`make uninstall`): what it removes beyond the deploy's own files -----
    "uninstall_model": K(False, "uninstall also deletes the checkpoint (hours to download again)", bool),
    "uninstall_driver": K(
        False, "uninstall also purges the NVIDIA driver, its apt repository and pin, and the CUDA toolkit", bool
    ),
    # --- NVIDIA driver and CUDA (docs/sources.md §6, §7) ----------------------------------
    "driver_source": K(
        "nvidia-repo",
        "Debian 13 ships 550, CUDA 12.8 needs >= 570.26: NVIDIA's repository, or a driver already installed",
        choices=("nvidia-repo", "preinstalled"),
        platforms={"gb10": On("the GB10 box runs the driver that DGX OS ships", choices=("preinstalled",))},
    ),
    "driver_branch": K(
        "590",
        "the first branch NVIDIA's debian13 repository carried (580 is not in it); runs CUDA 12.8 and 13.x",
        pattern=r"[0-9]{3}",
        shape="a driver branch, three digits like 590",
    ),
    "driver_min_version": K("570.26", "oldest driver CUDA 12.8 runs on", **VERSION),
    "driver_open_modules": K(True, "Ada and newer run NVIDIA's open kernel modules", bool),
    "nvidia_repo_url": K(
        "https://developer.download.nvidia.com/compute/cuda/repos/debian13/x86_64/",
        "NVIDIA's CUDA apt repository; a local mirror URL works for air-gapped hosts",
        **URL,
    ),
    "nvidia_repo_key_url": K(
        "https://developer.download.nvidia.com/compute/cuda/repos/debian13/x86_64/8793F200.pub",
        "signing key of that repository (https://, or file:// for a key staged on the host)",
        **KEY_URL,
    ),
    "nvidia_repo_key_fingerprint": K(
        "02182E60104FCDC26EAE1B8597A5D4CB8793F200",
        "the only key apt may trust for that repository: NVIDIA's Debian 13 key",
        **HEX40,
    ),
    "hold_kernel": K(
        False, "holding linux-* blocks kernel security updates; DKMS builds the module for each new kernel", bool
    ),
    "cuda_version": K(
        "12.8",
        "toolkit the engine's JIT compiles use, beside the driver",
        choices=("12.8", "12.9", "13.0"),
        platforms={"gb10": On("the fork is built against DGX OS's CUDA 13.0", choices=("13.0",))},
    ),
    "cuda_runfile_url": K(
        "https://developer.download.nvidia.com/compute/cuda/12.8.1/local_installers/cuda_12.8.1_570.124.06_linux.run",
        "NVIDIA's debian13 repository has no 12.x toolkit: the runfile installs it toolkit-only",
        **URL,
    ),
    "cuda_runfile_sha256": K(
        "228f6bcaf5b7618d032939f431914fc92d0e5ed39ebe37098a24502f26a19797",
        "checked before the runfile runs (docs/sources.md §7)",
        **SHA256,
    ),
    "fix_cuda_header": K(True, "CUDA 12.x math_functions.h breaks every JIT compile on glibc >= 2.41", bool),
    # --- engine, L40S path (docs/sources.md §2-5) ----------------------------------------
    "engine_set": K(
        "0.7.0.post1",
        "the field-validated ktransformers/kt-kernel/sglang-kt set",
        choices=("0.7.0.post1", "0.7.0.post4", "0.7.2"),
    ),
    "python_version": K(
        "3.11",
        "kt-kernel ships cp311 and cp312 wheels only",
        choices=("3.11", "3.12"),
        platforms={
            "gb10": On("the fork is built with DGX OS's own python3.12", choices=("3.12",)),
            "cpu": On("torch's CPU build (2.13.0+cpu) is a cp311 wheel only", choices=("3.11",)),
        },
    ),
    "python_source": K(
        "",
        "a CPython 3.11/3.12 install tree on the control machine to pack instead of downloading one "
        "(control machines without internet); empty: python_release",
        optional=True,
        **LOCAL_PATH,
    ),
    "python_release": K(
        "3.11.18",
        "the CPython the pinned uv (locks/tools.txt) downloads when python_source is empty, "
        "checked against the sha256 uv carries; packed and uploaded, hosts need no internet",
        **VERSION,
    ),
    "cudnn_version": K("9.16.0.29", "torch 2.9.1 pins cuDNN 9.10, which sglang-kt refuses for this model", **VERSION),
    "install_root": K("/opt/glm-flash", "engine environments, host tools and their state live here", **HOST_PATH),
    "python_runtime_packages": K(
        [
            "libssl3t64",
            "libffi8",
            "libsqlite3-0",
            "libbz2-1.0",
            "liblzma5",
            "zlib1g",
            "libreadline8t64",
            "libncursesw6",
            "libtinfo6",
            "libuuid1",
            "libnsl2",
            "libtirpc3t64",
            "libcrypt1",
            "libexpat1",
            "libgomp1",
            "libnuma1",
        ],
        "trixie libraries the uploaded CPython's extension modules and the engine wheels link against",
        list,
        **DEB_PACKAGE,
    ),
    "tp_size": K(
        2,
        "tensor parallel over both L40S",
        int,
        low=1,
        high=8,
        platforms={"gb10": On("the GB10 box has one GPU", high=1)},
    ),
    "kt_method": K("FP8", "native FP8 checkpoint, CPU experts on the AVX512-BF16 backend", choices=("FP8",)),
    "kt_cpuinfer": K(
        152, "of 160 cores on the EPYC 9845, leaving a few for the OS and GPU feeders", int, low=1, high=1024
    ),
    "kt_threadpool_count": K(
        2,
        "the engine's default, what the field report ran (NPS1, 1 NUMA node); None: one pool per NUMA node",
        int,
        low=1,
        high=64,
        optional=True,
    ),
    "kt_max_deferred_experts_per_token": K(4, "+15% decode; 0 gives bit-exact expert application", int, low=0, high=8),
    "kt_gpu_prefill_token_threshold": K(2048, "layerwise GPU prefill above this many tokens", int, low=1),
    "kt_transport": K(
        "native",
        "native overlaps H2D with attention: 85 s vs 105 s legacy on 68k",
        choices=("auto", "native", "legacy"),
    ),
    "chunked_prefill_size": K(32768, "measured optimum on sm_89; 40960 runs out of memory", int, low=1024),
    "max_mamba_cache_size": K(16, "requests in flight; CUDA graphs above it are dropped", int, low=1, high=256),
    "cuda_graph_bs": K(
        [1, 2, 4, 8, 16, 24], "decode without graphs collapses to 3.8 tok/s/user at n=5", list, items=int, low=1
    ),
    "mem_fraction_static": K(0.55, "field value with TP=2 and the KV pool below", float, low=0.05, high=0.95),
    "context_length": K(
        524288,
        "524k per request, no degradation measured at 200k",
        int,
        low=4096,
        platforms={"l40s": On("GLM-5.3-Flash is not known to serve beyond 1M tokens", high=1048576)},
    ),
    "kv_cache_dtype": K(
        "fp8_e4m3",
        "~1.9M-token KV pool in fp8 (field report, Sept 4)",
        choices=("fp8_e4m3", "fp8_e5m2", "bfloat16", "auto"),
    ),
    "pytorch_alloc_conf": K(
        "",
        "expandable_segments breaks CUDA graph capture with TP > 1; empty unsets both variables",
        optional=True,
        **ALLOC_CONF,
    ),
    "triton_configs_dir": K(
        "",
        "tuned Triton configs for this GPU (a directory on the control machine); empty: engine defaults",
        optional=True,
        **LOCAL_PATH,
    ),
    "tool_call_parser": K("glm47", "tool calls of GLM-5.x", **IDENT),
    "reasoning_parser": K("glm45", "reasoning of GLM-5.x", **IDENT),
    # --- model ---------------------------------------------------------------------
    "model_id": K("zai-org/GLM-5.3-Flash", "the checkpoint on the Hugging Face hub", **HF_REPO),
    "model_revision": K("main", "pin a commit for reproducible deploys", **REF),
    "model_path": K("/srv/models/GLM-5.3-Flash", "where the 306 GiB checkpoint lives on the host", **HOST_PATH),
    "model_download": K(True, "False: the checkpoint is staged on the host by other means", bool),
    "hf_token_env": K(
        "HF_TOKEN",
        "control-machine variable with a Hugging Face token (gated or private repos), read at deploy time",
        **ENV_NAME,
    ),
    "hf_token_vault": K(
        "",
        "ansible-vault encrypted file on the control machine holding the token; password from "
        "ANSIBLE_VAULT_PASSWORD_FILE",
        optional=True,
        **LOCAL_PATH,
    ),
    "hf_endpoint": K(
        "https://huggingface.co",
        "the hub the downloader asks (HF_ENDPOINT); the sandbox points it at its stand-in",
        **URL,
    ),
    "download_progress_s": K(
        30, "seconds between the checkpoint download's progress lines (bytes, rate, ETA)", int, low=1, high=3600
    ),
    "huggingface_hub_version": K(
        "1.33.0", "the downloader on the host; the engine locks pin the same version", **PEP440
    ),
    # --- a fleet's transfers (roles/fleet/artifacts.py, docs/fleet.md) -----------------
    "fleet_address": K(
        "",
        "the worker's address on the fleet's private network: its peer file server binds there and the "
        "other workers fetch from there; empty: its SSH address (a cloud fleet's public one)",
        optional=True,
        **IP_ADDRESS,
    ),
    "fleet_network_private": K(
        False,
        "set in shared=: the operator's word that the network between the fleet's machines is theirs alone "
        "(a switch or VLAN no one else uses). The gateway's requests to the workers (with the worker key) and "
        "the workers' peer transfers (checkpoint, engine files) cross it unencrypted; a fleet whose machines "
        "talk over any address off loopback is refused without it (docs/fleet.md, The fleet's network)",
        bool,
    ),
    "fleet_peer_idle_s": K(
        120,
        "a worker's peer file server stops itself after this many seconds without a request "
        "(after a killed deploy); it is stopped at the transfer's end anyway",
        int,
        low=5,
        high=3600,
    ),
    # --- service -------------------------------------------------------------------
    "service_user": K("glm-flash", "the engine never runs as root", **UNPRIVILEGED_USER),
    "listen_host": K("127.0.0.1", "loopback unless an API key protects the port", **LISTEN),
    "port": K(30000, "SGLang's default port; the engine is unprivileged, so 1024 and up", int, low=1024, high=65535),
    "api_key_env": K(
        "GLM_FLASH_API_KEY", "control-machine variable holding the API key, read at deploy time", **ENV_NAME
    ),
    "startup_timeout_s": K(
        3600,
        "loading 306 GiB and capturing graphs takes long",
        int,
        low=60,
        platforms={
            "gb10": On(
                "GB10 default 7200: a first start also builds the 2-bit planes from the 306 GiB FP8 checkpoint, "
                "writes the ~146 GB FP4 expert store and JIT-compiles flashinfer (no jit-cache); none of it is "
                "measured in the record, so twice the L40S's",
                low=60,
            )
        },
    ),
    "engine_extra_args": K(
        [],
        "flags passed to the engine as they are, after the profile's own: each checked by the installed "
        "engine's parser before the switch, like every generated flag; a flag the profile sets (port, key, "
        "TP size, model path, ...) is refused: set its knob. One word per item: [\"--enable-torch-compile\"], "
        "[\"--schedule-policy\", \"lpm\"] or [\"--schedule-policy=lpm\"]",
        list,
        pattern=r"[A-Za-z0-9._+=:,/@-]+",
        shape="a command-line word of letters, digits and . _ + = : , / @ - (no spaces, quotes, $ or %)",
    ),
    "served_model_name": K("glm-5.3-flash", "model name clients send", **MODEL_NAME),
    "restart_limit": K(3, "restarts within restart_window_s before systemd gives up", int, low=1, high=100),
    "restart_window_s": K(3600, "window for restart_limit", int, low=60),
    # --- a fleet worker behind a gateway (control/fleet.py fills the fleet_* ones) -----
    "engine_allow_from": K(
        [],
        "behind a gateway, the engine accepts connections only from loopback, its own address and the "
        "gateway's; these addresses or networks too (a Prometheus server scraping /metrics)",
        list,
        **IP_NET,
    ),
    "fleet_gateway_address": K(
        "",
        "set by control.fleet.fleet(): the gateway's address; the engine unit allows it (IPAddressAllow=)",
        optional=True,
        **IP_NET,
    ),
    "fleet_own_address": K(
        "",
        "set by control.fleet.fleet(): the address the gateway reaches this worker on",
        optional=True,
        **IP_NET,
    ),
    "fleet_peer_port": K(
        0,
        "set by control.fleet.fleet(): the fleet's peer port, which the engine may not bind (0: none)",
        int,
        low=0,
        high=65535,
    ),
    "roll_batch": K(
        1,
        "behind a gateway, engines restart this many workers at a time, each taken out of the gateway first",
        int,
        low=1,
        high=1000,
    ),
    "roll_drain_s": K(
        10,
        "seconds a worker is out of the gateway before its engine restarts, so its requests finish",
        int,
        low=0,
        high=3600,
    ),
    # --- watching the node (roles/watch.py, docs/observability.md) --------------------
    "metrics": K(
        True,
        "engine /metrics, node-exporter and the GPU collector, listening only where listen_host does: "
        "a node nobody can watch fails unseen, and they cost a few MB and one nvidia-smi call per interval",
        bool,
    ),
    "node_exporter_port": K(9100, "prometheus-node-exporter's own default port", int, low=1024, high=65535),
    "gpu_metrics_interval_s": K(
        15, "how often the GPU collector runs nvidia-smi: Prometheus' usual scrape interval", int, low=5, high=3600
    ),
    "notify_command": K(
        [],
        "run (no shell, as nobody) when a unit gives up: its name as the last argument, its journal lines on "
        "stdin; empty: the failure is only recorded for glm-flash status",
        list,
        pattern=r"[A-Za-z0-9._+=:,/@-]+",
        shape="a command word of letters, digits and . _ + = : , / @ - (no spaces, quotes, $ or %)",
    ),
    "notify_webhook_env": K(
        "GLM_FLASH_NOTIFY_WEBHOOK",
        "control-machine variable holding the webhook URL (a secret: sent like the API key), read at deploy time",
        **ENV_NAME,
    ),
    "notify_journal_lines": K(20, "the failed unit's last journal lines sent with the word", int, low=1, high=500),
    # --- GB10 path: the vLLM-Moet fork on the official vLLM release (docs/sources.md §20, §8, §1) ---
    "vllm_repo_url": K(
        "https://github.com/lrozewicz/vLLM-Moet-GB10",
        "the vLLM-Moet fork (a patch and kernels on an official vLLM release), fetched at vllm_ref",
        **URL,
    ),
    "vllm_ref": K(
        "", "commit of the fork whose patch and kernels are served; required on gb10", optional=True, **COMMIT
    ),
    "vllm_version": K(
        "0.24.0",
        "the official vLLM release the fork's patch is made for; its wheels: locks/vllm/<version>-aarch64.txt",
        choices=("0.24.0",),
    ),
    "fork_patches": K(
        ["patch/vllm-moet-v0.24.0.patch"],
        "the fork's patches to vllm_version, in the order they apply (a series: the field report's scheduler "
        "fix is its 'patch 12'), inside the fork at vllm_ref; each checked with git apply --check on what "
        "the ones before it left",
        list,
        **FORK_PATH,
    ),
    "scheduler_fix_verified_ref": K(
        "",
        "the build refuses a fork whose scheduler's block_size assignments do not name the Mamba group (the "
        "field report's fix, found by name); set this to the very vllm_ref whose fix you read by hand to "
        "accept one written another way; any other commit is refused, so a new vllm_ref is checked again",
        optional=True,
        **COMMIT,
    ),
    "fork_kernels": K(
        "kernels/cubins-sm120",
        "the fork's prebuilt cubins (GB10 runs the sm_120 ones exactly), served as VLLM_MOE_W2_CUBIT_DIR",
        **FORK_PATH,
    ),
    "deepgemm_repo_url": K(
        "https://github.com/deepseek-ai/DeepGEMM.git",
        "DeepGEMM's repository, the URL the fork's Dockerfile.sm120-v024 clones; built into the engine environment",
        **URL,
    ),
    "deepgemm_ref": K(
        "a6b593d2826719dcf4892609af7b84ee23aaf32a",
        "the DeepGEMM commit the fork's Dockerfile swaps in (its DEEPGEMM_REF; the release pin has no sm_12x paths)",
        **COMMIT,
    ),
    "moe_w2": K(True, "VLLM_MOE_W2=1: routed experts as 2-bit planes built from the FP8 checkpoint at load", bool),
    "moe_w2_delta_gb": K(
        2.0,
        "VLLM_MOE_W2_DELTA_GB: GPU pool of the hottest experts at FP4; HumanEval 95.7% -> 92.1% without it",
        float,
        low=0,
        high=64,
    ),
    "moe_w2_gate": K(False, "VLLM_MOE_W2_GATE: the confidence gate; off in the field report", bool),
    "moe_w2_store": K(
        True,
        "VLLM_MOE_W2_STORE_DIR in the service's state directory: the expert store on NVMe, not in RAM",
        bool,
    ),
    "drafter_model": K("incoai/GLM-5.3-Flash-DFlash2", "DFlash2 gave +49% decode on code over MTP", **HF_REPO),
    "accept_drafter_license": K(False, "the drafter is CC-BY-NC-ND-4.0: accept it explicitly", bool),
    "num_speculative_tokens": K(7, "k=7: acceptance length 5.5 on code", int, low=1, high=16),
    "max_model_len": K(
        204800,
        "200K context fits 121.6 GiB with one stream; at most the checkpoint's max_position_embeddings "
        "(1,048,576) and what the unified memory left beside the model holds (control/rules.py)",
        int,
        low=4096,
        high=1048576,
    ),
    "reasoning_effort": K(
        "low", "the default max is far too slow for local agent work", choices=("low", "medium", "high", "max")
    ),
    "thinking_token_budget": K(1536, "caps thinking when low is ignored; 1536 works for coding", int, low=0),
    "max_num_seqs": K(1, "DFlash2 k=7 leaves room for one long stream", int, low=1, high=64),
    "gpu_memory_utilization": K(
        0.90, "of 121.6 GiB unified memory: model 99.6 GiB + KV 6-7.5 GiB", float, low=0.1, high=0.98
    ),
    "mamba_cache_mode": K(
        "align", "prefix caching with the KDA checkpoints every 7168 tokens", choices=("align", "all", "none")
    ),
    "drafter_revision": K(
        "bf582e4eacc1810f76656d1811693ff6c6737d2a",
        "the drafter's commit public GB10 recipes pin (docs/sources.md §20)",
        **REF,
    ),
    "drafter_path": K("/srv/models/GLM-5.3-Flash-DFlash2", "where the drafter is downloaded on the host", **HOST_PATH),
    "drop_page_cache": K(
        False, "flush the page cache before the engine loads: on unified memory it competes with the model", bool
    ),
    "memory_guard_gib": K(
        0.0,
        "earlyoom stops the engine when the host's available memory (MemAvailable) falls below this "
        "many GiB (SIGTERM, SIGKILL at half); for unified memory, which no cgroup limit sees. 0: no guard",
        float,
        low=0,
    ),
    # --- preflight (roles/preflight.py): what the box must have before anything long starts ---
    "preflight_model_gib": K(
        306.0,
        "the FP8 checkpoint on the hub; needed free where model_path is, less what is already there",
        float,
        low=0,
    ),
    "preflight_engine_env_gib": K(
        11.0,
        "one built engine environment (torch and the CUDA wheels); an upgrade keeps two side by side",
        float,
        low=0,
    ),
    "preflight_wheelhouse_gib": K(
        6.0, "the host's wheelhouse: 4.8 GiB of wheels per L40S engine set, two sets share most", float, low=0
    ),
    "preflight_moe_store_gib": K(
        136.0,
        "GB10: the fork's FP4 store of all experts on disk, about 146 GB in the field report (moe_w2_store)",
        float,
        low=0,
    ),
    "preflight_drafter_gib": K(2.5, "GB10: the DFlash2 drafter, about 2.3 GB", float, low=0),
    "preflight_cuda_runfile_gib": K(
        5.1,
        "NVIDIA's CUDA 12.8.1 runfile, 5,382,238,770 bytes, kept under /var/cache/glm-flash/cuda until the "
        "toolkit is in (docs/sources.md §7); counted only while the toolkit is not installed",
        float,
        low=0,
    ),
    "preflight_cuda_extract_gib": K(
        7.5,
        "the runfile unpacked under /var/tmp while it installs (every component it carries); counted with the runfile",
        float,
        low=0,
    ),
    "preflight_cuda_toolkit_gib": K(
        7.0,
        "the installed toolkit under /usr/local/cuda-X.Y; counted only while it is not installed",
        float,
        low=0,
    ),
    "preflight_memory_gib": K(
        330.0,
        "MemTotal; the FP8 CPU experts of the 306 GiB checkpoint stay in RAM: KTransformers' recipe asks for "
        "at least 350 GB (326 GiB) available, plus the OS (docs/sources.md §2; the field box: 768 GB)",
        float,
        low=0,
    ),
    "preflight_cpu_flags": K(
        ["avx512f", "avx512bw", "avx512_vnni", "avx512_vbmi", "avx512_bf16"],
        "kt-kernel's avx512_bf16 CPU-expert variant, the field box's (docs/sources.md §2); empty: not checked",
        list,
        pattern=r"[a-z0-9_]+",
        shape="a CPU flag as /proc/cpuinfo names it (lowercase letters, digits, _)",
    ),
}

# What the GB10 box changes relative to the L40S defaults.
PLATFORMS: dict[str, dict[str, Any]] = {
    "l40s": {},
    "gb10": {
        "gpu_count": 1,
        "gpu_compute_capability": "12.1",
        "driver_source": "preinstalled",
        "driver_min_version": "580.0",
        "cuda_version": "13.0",
        "fix_cuda_header": False,
        "tp_size": 1,
        "port": 8000,
        "python_version": "3.12",
        # First start: 2-bit planes from 306 GiB, the ~146 GB FP4 store written, flashinfer JIT-compiled
        # (no jit-cache): not measured anywhere in the record, so twice the L40S's 3600 s.
        "startup_timeout_s": 7200,
        # DGX OS's own python3.12 builds the fork's environment; the page cache shares the 121.6 GiB.
        "drop_page_cache": True,
        # The GPU allocates from the same memory: guard the host's available memory (roles/memory_guard.py).
        "memory_guard_gib": 4.0,
        # Preflight: vLLM needs no AVX-512; model 99.6 GiB + KV 7.5 GiB share the unified memory.
        "preflight_cpu_flags": [],
        "preflight_memory_gib": 107.0,
        "preflight_wheelhouse_gib": 0.0,
        # The fork builds its 2-bit expert planes from the FP8 checkpoint at load: the same download as the L40S.
        "base_packages": [
            "ca-certificates",
            "curl",
            "git",
            "python3",  # DGX OS has it; uv builds the downloader's environment with it (roles/tools.py)
            "python3.12-dev",  # Python.h for DeepGEMM's build (uv makes the engine's venv: no venv module needed)
            "build-essential",
            "cmake",
            "ninja-build",
            "pciutils",
            "jq",
        ],
    },
}

# The sandbox's CPU engine (roles/engines/cpu/): the L40S box's roles, no GPU, vLLM's CPU build
# serving a tiny Llama (sandbox/tiny_model.py: 32,768 positions; 16,384 leaves the bench's 4k
# prefill and its calibration room).
PLATFORMS["cpu"] = {
    "gpu_count": 0,
    "tp_size": 1,
    "max_model_len": 16384,
    # About 30 s on an idle 2-core machine; minutes when other jobs share it.
    "startup_timeout_s": 1200,
}

# pyinfra's own keys may sit beside profile keys in an inventory: its connectors' data keys and
# its global arguments, read from the installed pyinfra (control/profile.py). A key with one of
# these prefixes that pyinfra does not know is a typo like any other.
CONNECTOR_PREFIXES = ("ssh_", "_", "chroot_", "docker_", "podman_", "local_", "fake_", "vagrant_", "terraform_")
# Keys whose values are TCP ports on the host: none may be another's or the SSH port.
PORT_KEYS = tuple(key for key in KNOBS if key == "port" or key.endswith("_port"))
