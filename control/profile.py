"""The host profile: inventory data checked against `defaults.KNOBS`.

Checking happens while pyinfra loads the inventory, before it connects to any host,
and again in deploy.py after `--data` overrides. A mistake ends the run with one
line per problem naming the host, the key, what is wrong and how to fix it.
"""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from control.defaults import CONNECTOR_PREFIXES, KNOBS, PLATFORMS, Knob


@dataclass(frozen=True)
class Problem:
    host: str
    key: str
    problem: str
    fix: str

    def __str__(self) -> str:
        return f"{self.host}: {self.key}: {self.problem}. Fix: {self.fix}"


class ProfileError(Exception):
    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class Profile:
    """Read-only view of a host's resolved settings: `profile.tp_size`."""

    def __init__(self, host: str, values: dict[str, Any]):
        object.__setattr__(self, "host", host)
        object.__setattr__(self, "_values", dict(values))

    def __getattr__(self, key: str) -> Any:
        try:
            return self._values[key]
        except KeyError:
            raise AttributeError(key) from None

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError("a profile is read-only")

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)


def _type_name(kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {int: "a whole number", float: "a number", bool: "true or false", str: "a string", list: "a list"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _check_value(host: str, key: str, knob: Knob, value: Any) -> Problem | None:
    if value is None:
        if knob.optional:
            return None
        return Problem(host, key, "must not be None", f"set it to {knob.default!r} ({knob.why}) or remove the key")
    kinds = knob.kind if isinstance(knob.kind, tuple) else (knob.kind,)
    ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
    if float in kinds and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if not ok:
        return Problem(
            host,
            key,
            f"{value!r} is {type(value).__name__}, expected {_type_name(knob.kind)}",
            f"write it like the default {knob.default!r}",
        )
    if knob.choices and value not in knob.choices:
        near = difflib.get_close_matches(str(value), [str(c) for c in knob.choices], n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        return Problem(
            host,
            key,
            f"{value!r} is not one of {', '.join(map(repr, knob.choices))}",
            f"{hint}use one of the listed values",
        )
    if knob.low is not None and value < knob.low:
        return Problem(host, key, f"{value!r} is below the minimum {knob.low}", f"use a value from {knob.low} up")
    if knob.high is not None and value > knob.high:
        return Problem(host, key, f"{value!r} is above the maximum {knob.high}", f"use a value up to {knob.high}")
    return None


def _is_connector_key(key: str) -> bool:
    return key.startswith(CONNECTOR_PREFIXES)


def _cross_checks(host: str, v: dict[str, Any]) -> Iterable[Problem]:
    """Settings that contradict each other or what the field report measured."""
    alloc = v["pytorch_alloc_conf"] or ""
    if "expandable_segments:true" in alloc.replace(" ", "").lower() and v["tp_size"] > 1:
        yield Problem(
            host,
            "pytorch_alloc_conf",
            "expandable_segments with tp_size > 1 breaks CUDA graph capture "
            "(custom all-reduce buffers cannot be IPC-exported)",
            "remove expandable_segments, or set tp_size: 1",
        )
    if v["platform"] == "l40s":
        if v["gpu_compute_capability"] in ("8.6", "8.9") and v["chunked_prefill_size"] > 32768:
            yield Problem(
                host,
                "chunked_prefill_size",
                f"{v['chunked_prefill_size']} runs out of memory on sm_86/sm_89 "
                "(the field report crashed at 40960 in the mHC fp32 fallback)",
                "use 32768 or less",
            )
        if v["tp_size"] > v["gpu_count"] and v["require_gpu"]:
            yield Problem(
                host,
                "tp_size",
                f"{v['tp_size']} exceeds gpu_count {v['gpu_count']}",
                "set tp_size to at most the number of GPUs",
            )
        if v["gpu_compute_capability"] == "9.0":
            yield Problem(
                host,
                "gpu_compute_capability",
                "sglang-kt's GLM-5 config rejects sm_90 (Hopper)",
                "use 8.6, 8.9 or a Blackwell capability",
            )
        if v["driver_source"] == "debian" and v["cuda_version"].startswith(("12.8", "12.9", "13.")):
            yield Problem(
                host,
                "driver_source",
                f"Debian 13 ships driver 550, CUDA {v['cuda_version']} needs 570.26 or newer",
                "use driver_source: 'nvidia-repo' (or a local mirror of it via nvidia_repo_url)",
            )
        if v["require_gpu"] and v["gpu_count"] == 0:
            yield Problem(
                host, "gpu_count", "0 GPUs with require_gpu true", "set gpu_count, or require_gpu: false for a test box"
            )
        if any((not isinstance(b, int) or isinstance(b, bool) or b < 1) for b in v["cuda_graph_bs"]):
            yield Problem(
                host,
                "cuda_graph_bs",
                f"{v['cuda_graph_bs']!r} must hold positive whole numbers",
                "write e.g. [1, 2, 4, 8, 16]",
            )
        elif not any(b <= v["max_mamba_cache_size"] for b in v["cuda_graph_bs"]):
            yield Problem(
                host,
                "cuda_graph_bs",
                f"every size is above max_mamba_cache_size {v['max_mamba_cache_size']}, "
                "so no CUDA graph would be captured",
                "include sizes up to max_mamba_cache_size",
            )
        if v["kt_gpu_prefill_token_threshold"] > v["chunked_prefill_size"]:
            yield Problem(
                host,
                "kt_gpu_prefill_token_threshold",
                "is larger than chunked_prefill_size, so GPU prefill never runs",
                "keep it at or below chunked_prefill_size",
            )
        if v["context_length"] > 1048576:
            yield Problem(
                host, "context_length", "GLM-5.3-Flash is not known to serve beyond 1M tokens", "use 524288 or less"
            )
        release = v["python_release"]
        if not __import__("re").fullmatch(r"\d+\.\d+\.\d+", release) or not release.startswith(
            v["python_version"] + "."
        ):
            yield Problem(
                host,
                "python_release",
                f"{release!r} is not a CPython {v['python_version']}.N release",
                f"write a {v['python_version']}.N release that the pinned uv offers "
                f"(`uv python list --all-versions {v['python_version']}`)",
            )
        src = v["python_source"]
        if src and not os.path.isfile(os.path.join(os.path.expanduser(src), "bin", "python" + v["python_version"])):
            yield Problem(
                host,
                "python_source",
                f"{src!r} has no bin/python{v['python_version']} on the control machine",
                f"name a CPython {v['python_version']} install tree, e.g. ~/.pyenv/versions/{v['python_version']}.x",
            )
    if v["driver_source"] == "nvidia-repo":
        re_ = __import__("re")
        if not re_.fullmatch(r"[0-9A-Fa-f]{40}", v["nvidia_repo_key_fingerprint"]):
            yield Problem(
                host,
                "nvidia_repo_key_fingerprint",
                f"{v['nvidia_repo_key_fingerprint']!r} is not a 40-hex-digit OpenPGP fingerprint",
                "write the key's full fingerprint (gpg --show-keys KEYFILE), no spaces",
            )
        if not v["nvidia_repo_key_url"].startswith(("https://", "file:///")):
            yield Problem(
                host,
                "nvidia_repo_key_url",
                f"{v['nvidia_repo_key_url']!r} is neither https:// nor file:///",
                "fetch the key over https, or stage it on the host and write file:///path",
            )
        if not re_.fullmatch(r"\d{3}", str(v["driver_branch"])):
            yield Problem(
                host, "driver_branch", f"{v['driver_branch']!r} is not a driver branch", "write it like '590'"
            )
        if not re_.fullmatch(r"[0-9a-f]{64}", v["cuda_runfile_sha256"]):
            yield Problem(
                host,
                "cuda_runfile_sha256",
                "is not a sha256 (64 lowercase hex digits)",
                "copy the runfile's sha256 from NVIDIA's checksums",
            )
        name = v["cuda_runfile_url"].rsplit("/", 1)[-1]
        if v["platform"] == "l40s" and not re_.fullmatch(
            r"cuda_" + re_.escape(v["cuda_version"]) + r"\.\d+_[0-9.]+_linux\.run", name
        ):
            yield Problem(
                host,
                "cuda_runfile_url",
                f"{name!r} is not NVIDIA's x86_64 runfile of CUDA {v['cuda_version']} "
                "(used when the repository has no cuda-toolkit package of that version)",
                f"set cuda_runfile_url and cuda_runfile_sha256 to the cuda_{v['cuda_version']}.N runfile",
            )
    if v["platform"] == "gb10":
        if not v["vllm_ref"]:
            yield Problem(
                host,
                "vllm_ref",
                "is empty; the GB10 engine is built from a pinned ref",
                "set vllm_ref to the commit of the vLLM-Moet fork to build",
            )
        if v["driver_source"] != "preinstalled":
            yield Problem(
                host,
                "driver_source",
                "the GB10 box runs the driver that DGX OS ships",
                "use driver_source: 'preinstalled'",
            )
        if v["tp_size"] != 1:
            yield Problem(host, "tp_size", "the GB10 box has one GPU", "set tp_size: 1")
        if v["vllm_ref"] and not __import__("re").fullmatch(r"[0-9a-f]{40}", v["vllm_ref"]):
            yield Problem(
                host,
                "vllm_ref",
                f"{v['vllm_ref']!r} is not a full commit hash (a branch or tag moves)",
                "write the fork's 40-character commit, e.g. from `git ls-remote <vllm_repo_url> <tag>`",
            )
        if not v["accept_drafter_license"]:
            yield Problem(
                host,
                "accept_drafter_license",
                f"the drafter {v['drafter_model']} is licensed "
                "CC-BY-NC-ND-4.0 (attribution, non-commercial use only, no derivatives) and is downloaded "
                "only once that is accepted",
                "read https://creativecommons.org/licenses/by-nc-nd/4.0/, "
                "then set accept_drafter_license: true in this host's inventory entry",
            )
    if v["listen_host"] not in ("127.0.0.1", "::1", "localhost") and not v["_api_key_present"]:
        yield Problem(
            host,
            "listen_host",
            f"{v['listen_host']} exposes the engine without an API key",
            f"export {v['api_key_env']} on the control machine, or keep listen_host: 127.0.0.1",
        )
    if not v["install_root"].startswith("/") or not v["model_path"].startswith("/"):
        key = "install_root" if not v["install_root"].startswith("/") else "model_path"
        yield Problem(host, key, f"{v[key]!r} is not an absolute path", "write a path starting with /")
    if v["service_user"] == "root":
        yield Problem(
            host, "service_user", "the engine must not run as root", "use an unprivileged name such as glm-flash"
        )


def build(host: str, data: dict[str, Any], api_key_present: bool | None = None) -> Profile:
    """Resolve defaults, platform overlay and inventory data; raise ProfileError on mistakes."""
    problems: list[Problem] = []
    platform = data.get("platform", KNOBS["platform"].default)
    if platform not in PLATFORMS:
        problem = _check_value(host, "platform", KNOBS["platform"], platform)
        raise ProfileError([problem or Problem(host, "platform", f"{platform!r} is unknown", "use l40s or gb10")])
    values = {k: knob.default for k, knob in KNOBS.items()}
    values.update(PLATFORMS[platform])
    for key, value in data.items():
        if _is_connector_key(key):
            continue
        knob = KNOBS.get(key)
        if knob is None:
            near = difflib.get_close_matches(key, list(KNOBS), n=1, cutoff=0.6)
            fix = f"did you mean {near[0]!r}?" if near else "remove it; control/defaults.py lists every key"
            problems.append(Problem(host, key, "unknown key", fix))
            continue
        problem = _check_value(host, key, knob, value)
        if problem:
            problems.append(problem)
        else:
            values[key] = float(value) if knob.kind is float else value
    if not problems:
        if api_key_present is None:
            api_key_present = bool(os.environ.get(values["api_key_env"]))
        values["_api_key_present"] = api_key_present
        problems.extend(_cross_checks(host, values))
        values.pop("_api_key_present")
    if problems:
        raise ProfileError(problems)
    return Profile(host, values)


def fail(error: ProfileError) -> None:
    """Print the problems for a person and exit non-zero, without a traceback."""
    print("glm-flash: the inventory has mistakes; no host was changed.", file=sys.stderr)
    for p in error.problems:
        print(f"  - {p}", file=sys.stderr)
    raise SystemExit(2)


PLACEHOLDER_LABEL = "example"  # the example inventories' hosts: gpu1.example.lan, gx10.example.lan
PLACEHOLDER_REF = "0" * 40


def _first_contact(name: str, data: dict[str, Any]) -> Iterable[Problem]:
    """Mistakes a new user makes with a copied example inventory; pyinfra would otherwise stop
    on them only after connecting, or with a traceback."""
    address = data.get("ssh_hostname") or name
    if isinstance(address, str) and PLACEHOLDER_LABEL in address.lower().split("."):
        yield Problem(
            name,
            "ssh_hostname" if data.get("ssh_hostname") else "(host name)",
            f"{address!r} is the example inventory's placeholder",
            "write your host's name or IP address",
        )
    if data.get("vllm_ref") == PLACEHOLDER_REF:
        yield Problem(
            name,
            "vllm_ref",
            "is the example inventory's placeholder (forty zeros)",
            "write the fork's commit: `git ls-remote <vllm_repo_url> <tag>`",
        )
    fixes = {
        "ssh_key": "create one with `ssh-keygen -t ed25519`, install it on the host with `ssh-copy-id`, "
        "and name its private half here",
        "ssh_known_hosts_file": "fill it as the README's \"First real host\" says (ssh-keyscan, then compare the "
        "fingerprint with the one the host shows)",
    }
    for key, fix in fixes.items():
        value = data.get(key)
        if not value:
            continue
        if not isinstance(value, str):
            yield Problem(name, key, f"{value!r} is {type(value).__name__}, expected a path", fix)
            continue
        path = os.path.expanduser(value)
        if not os.path.isfile(path):
            yield Problem(name, key, f"{value!r} does not exist on this machine (from {os.getcwd()})", fix)
        elif not os.access(path, os.R_OK):
            yield Problem(name, key, f"{value!r} is not readable by this user", "run as the user who owns it")


def hosts(*entries: tuple[str, dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """Inventory helper: check every host's data while the inventory loads."""
    problems: list[Problem] = []
    seen = set()
    for entry in entries:
        if not (
            isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], str) and isinstance(entry[1], dict)
        ):
            problems.append(
                Problem(
                    repr(entry)[:40],
                    "(entry)",
                    "is not a (name, {data}) pair",
                    'write ("host.example", {"tp_size": 2})',
                )
            )
            continue
        name, data = entry
        if name in seen:
            problems.append(Problem(name, "(name)", "appears twice", "give each host one entry"))
        seen.add(name)
        problems.extend(_first_contact(name, data))
        try:
            build(name, data)
        except ProfileError as e:
            problems.extend(e.problems)
    if problems:
        fail(ProfileError(problems))
    return list(entries)


def for_current_host() -> Profile:
    """The current pyinfra host's profile, after --data overrides; exits cleanly on mistakes."""
    from pyinfra import host

    try:
        return build(host.name, host.data.dict())
    except ProfileError as e:
        fail(e)
        raise  # unreachable: fail() exits
