"""make eval against stand-in servers: pass@1, HumanEval+, the loop probe, two endpoints compared,
hostile completions confined, a resumed run. Each runs a handful of the 164 problems."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import signal
import socket
import subprocess
import threading

import pytest

from benchmark.loops import TOPICS
from tests.bench.conftest import KEY, REPO
from tests.bench.fake_openai import FakeOpenAI
from tests.eval.conftest import COMPARE_KEY, eval_cmd, eval_env, right, task_of, wrong

TASKS = [0, 2, 13, 23, 38, 53, 97, 115, 151, 162]  # 162 needs hashlib (a shared library) in the sandbox
RIGHT = {0, 13, 38, 115, 162}


def ids(numbers) -> list[str]:
    return [f"HumanEval/{n}" for n in numbers]


def tasks_arg(numbers) -> str:
    return ",".join(str(n) for n in numbers)


def answering(problems, choose):
    """An answer function for FakeOpenAI: choose(task id, problem) -> content (or (content, reasoning))."""

    def answer(text: str):
        tid = task_of(text, problems)
        return choose(tid, problems[tid]) if tid else "```python\nprint('hello')\n```"

    return answer


def test_pass_at_1_is_the_share_answered_right(problems, run_eval):
    def choose(tid, p):
        good = int(tid.split("/")[1]) in RIGHT
        # the reasoning holds a wrong block: only the answer's content is searched
        return (right(p) if good else wrong(p)), wrong(p)

    with FakeOpenAI(api_key=KEY, answer=answering(problems, choose)) as fake:
        run = run_eval("--url", fake.url, "--tasks", tasks_arg(TASKS))
    assert run.returncode == 0, run.stderr
    he = run.results["endpoints"]["a"]["humaneval"]
    assert (he["passed"], he["total"], he["pass_at_1"]) == (5, 10, 0.5)
    assert {t for t, v in he["items"].items() if v["passed"]} == set(ids(RIGHT))
    assert all("wrong on purpose" in v["reason"] for t, v in he["items"].items() if not v["passed"])
    body = fake.bodies[0]
    assert (body["temperature"], body["reasoning_effort"], body["thinking_token_budget"]) == (0, "low", 1536)
    assert "stream" not in body and len(fake.bodies) == len(TASKS)  # no loop probe with --tasks
    assert "| 50.0% (5/10) |" in run.report
    assert "97.0% (159/164)" in run.report and "95.1% (156/164)" in run.report
    assert "round-to-nearest codes (GB10 report's ablation) | 95.7% (157/164)" in run.report
    assert "93.9% (154/164)" in run.report and "89.6% (147/164)" in run.report


def test_humaneval_plus_from_evalplus_shaped_data(problems, run_eval, tmp_path):
    """evalplus's record (task_id, prompt, entry_point, canonical_solution, base_input, plus_input,
    atol, contract) written here for three problems; the real file is fetched from GitHub."""
    chosen = {"HumanEval/13": [[3, 5], [25, 15]], "HumanEval/2": [[3.5], [1.33]], "HumanEval/0": [[[1.0, 2.0], 0.5]]}
    plus_inputs = {
        "HumanEval/13": [[2000, 4000], [17, 34]],
        "HumanEval/2": [[123.456]],
        "HumanEval/0": [[[1.0, 1.2], 0.3]],
    }
    records = [
        dict(
            {k: problems[t][k] for k in ("task_id", "prompt", "entry_point", "canonical_solution")},
            base_input=chosen[t],
            plus_input=plus_inputs[t],
            atol=0,
            contract="",
        )
        for t in chosen
    ]
    data = gzip.compress("".join(json.dumps(r) + "\n" for r in records).encode())
    plus = tmp_path / "HumanEvalPlus.jsonl.gz"
    plus.write_bytes(data)

    def choose(tid, p):
        if tid == "HumanEval/13":  # right on HumanEval's small numbers, wrong on evalplus's large ones
            return f"```python\ndef greatest_common_divisor(a, b):\n    if a > 1000:\n        return 1\n{p['canonical_solution']}```"
        if tid == "HumanEval/2":  # not equal on 123.456 (0.456 against 0.45600000000000307), within 1e-6
            return "```python\ndef truncate_number(number):\n    return round(number % 1.0, 9)\n```"
        return right(p)

    with FakeOpenAI(api_key=KEY, answer=answering(problems, choose)) as fake:
        run = run_eval(
            "--url",
            fake.url,
            "--tasks",
            "0,2,13",
            "--plus",
            str(plus),
            "--plus-sha256",
            hashlib.sha256(data).hexdigest(),
        )
    assert run.returncode == 0, run.stderr
    r = run.results["endpoints"]["a"]
    assert r["humaneval"]["passed"] == 3
    plus_items = r["humaneval_plus"]["items"]
    assert [plus_items[t]["passed"] for t in ids([0, 2, 13])] == [True, True, False]
    assert "expected 2000" in plus_items["HumanEval/13"]["reason"]
    with FakeOpenAI(api_key=KEY, answer=answering(problems, choose)) as fake:
        bad = run_eval("--url", fake.url, "--tasks", "0", "--plus", str(plus))
    assert bad.returncode == 2 and "sha256 is not 272720b9" in bad.stderr


def test_humaneval_plus_without_github_says_why(problems, run_eval, tmp_path):
    # A proxy that refuses, what a machine without GitHub sees, fast: a port bound and not listening,
    # held for the whole run (closed first, another program could take it and answer).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
        env = eval_env(GLM_FLASH_CACHE=str(tmp_path / "cache"), HTTPS_PROXY=f"http://127.0.0.1:{closed}")
        with FakeOpenAI(api_key=KEY, answer=answering(problems, lambda t, p: right(p))) as fake:
            run = run_eval("--url", fake.url, "--tasks", "0", "--plus", "auto", env=env)
    assert run.returncode == 0, run.stderr
    why = run.results["plus_skipped"]
    assert why.startswith("HumanEval+ skipped: evalplus's data could not be downloaded from https://github.com/")
    assert "PLUS=<file>" in why and why in run.report and why in run.stderr
    assert "humaneval_plus" not in run.results["endpoints"]["a"]


def test_loop_probe_flags_a_server_that_repeats_itself(problems, run_eval):
    loop_line = "    self.items.append(self.items[-1] + 1)\n"
    normal = (
        "```python\n" + "".join(f"def step_{i}(x):\n    return x * {i} + {i * 7 % 13}\n\n" for i in range(120)) + "```"
    )

    def answer(text: str):
        if "Write a complete, long Python module" not in text:
            return right(problems[task_of(text, problems)])
        i = next(n for n, topic in enumerate(TOPICS) if topic in text)
        if i == 1:
            return "```python\nclass Store:\n    def grow(self):\n" + loop_line * 300
        if i == 3:
            return normal, "Let me think. " + "I should write the class first. " * 200
        return normal

    with FakeOpenAI(api_key=KEY, answer=answer) as fake:
        run = run_eval("--url", fake.url, "--tasks", "0", "--loops", "4")
    assert run.returncode == 0, run.stderr
    lp = run.results["endpoints"]["a"]["loop"]
    assert (lp["samples"], lp["answered"], lp["degenerate"]) == (4, 4, 2)
    flagged = {k: v["where"] for k, v in lp["items"].items() if v["degenerate"]}
    assert flagged == {"loop/1": "answer", "loop/3": "reasoning"}
    block = lp["items"]["loop/1"]["repeated_block"]  # the line, from wherever the run starts in it
    assert len(block) == len(loop_line) and block in loop_line * 2
    assert "| 2 of 4 |" in run.report and "loop/1" in run.report
    assert all(b["max_tokens"] == 8192 for b in fake.bodies if "long Python module" in b["messages"][0]["content"])


def sandbox_processes(uid: int) -> list[int]:
    """Live processes of the sandbox's uid. Zombies are left out: the sandbox's PID 1 is reparented to
    the machine's init when the outer bwrap exits and stays a zombie until that init reaps it."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if int(fields["Uid"].split()[0]) == uid and fields["State"].split()[0] not in ("Z", "X"):
            found.append(int(pid))
    return found


def test_hostile_completions_stay_in_the_sandbox(problems, bench_venv, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o777)
    victim = outside / "victim.txt"
    victim.write_text("unchanged\n")
    victim.chmod(0o666)  # even a world-writable file is out of reach: it is not in the sandbox
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    out = tmp_path / "out"
    hostile = {
        "HumanEval/0": f"open({str(outside / 'escaped')!r}, 'w').write('out')\nopen({str(victim)!r}, 'a').write('x')\n"
        f"open({str(out / 'planted.txt')!r}, 'w').write('x')",
        "HumanEval/2": f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)",
        "HumanEval/13": "import os\nwhile True:\n    os.fork()",
        "HumanEval/23": "import time\ntime.sleep(10 ** 6)",
        "HumanEval/38": "hog = bytearray(8 * 1024 ** 3)",
    }

    def choose(tid, p):
        if tid in hostile:
            return f"```python\n{hostile[tid]}\n{p['prompt']}{p['canonical_solution']}```"
        return right(p)

    with FakeOpenAI(api_key=KEY, answer=answering(problems, choose)) as fake:
        proc = subprocess.Popen(
            eval_cmd(bench_venv, "--url", fake.url, "--tasks", "0,2,13,23,38,53", "--timeout", "3", "--out", str(out)),
            cwd=REPO,
            env=eval_env(),
            stderr=subprocess.PIPE,
            text=True,
        )
        _, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 0, stderr
    items = json.loads((out / "results.json").read_text())["endpoints"]["a"]["humaneval"]["items"]
    assert items["HumanEval/53"] == {"passed": True, "reason": ""}  # the run went on and still scores
    assert "FileNotFoundError" in items["HumanEval/0"]["reason"]
    assert "ConnectionRefusedError" in items["HumanEval/2"]["reason"]
    assert (
        "Resource temporarily unavailable" in items["HumanEval/13"]["reason"]
        or "timed out" in items["HumanEval/13"]["reason"]
    )
    assert items["HumanEval/23"]["reason"] == "timed out after 3 s"
    assert "MemoryError" in items["HumanEval/38"]["reason"]
    assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"] and victim.read_text() == "unchanged\n"
    assert not (out / "planted.txt").exists()
    with pytest.raises(TimeoutError):
        listener.accept()
    listener.close()
    uid = 2_000_000_000 + proc.pid % 1_000_000  # benchmark/confine.py sandbox_uid() of that process
    assert sandbox_processes(uid) == []  # the fork bomb and the sleeper are gone


def test_two_endpoints_compared_item_by_item(problems, run_eval):
    tasks = list(range(10))
    a_right, b_right = {0, 1, 2, 3, 4, 5, 6}, {0, 1, 2, 7, 8}

    def chooser(good):
        return lambda tid, p: right(p) if int(tid.split("/")[1]) in good else wrong(p)

    with (
        FakeOpenAI(api_key=KEY, answer=answering(problems, chooser(a_right))) as a,
        FakeOpenAI(api_key=COMPARE_KEY, model="glm-5.3-flash-api", answer=answering(problems, chooser(b_right))) as b,
    ):
        run = run_eval("--url", a.url, "--compare-url", b.url, "--tasks", tasks_arg(tasks))
    assert run.returncode == 0, run.stderr
    c = run.results["comparison"]["humaneval"]
    # by hand: only a on 3,4,5,6; only b on 7,8; both on 0,1,2; neither on 9
    assert (c["items"], c["both_pass"], c["both_fail"]) == (10, 3, 1)
    assert c["a_only"] == ids([3, 4, 5, 6]) and c["b_only"] == ids([7, 8])
    assert c["agreement"] == 0.4
    assert c["mcnemar_p"] == pytest.approx(2 * (1 + 6 + 15) / 2**6)  # Binomial(6, 1/2), two-sided, min tail 2
    assert run.results["endpoints"]["b"]["model"] == "glm-5.3-flash-api"
    assert "p = 0.6875" in run.report and "only a 4, only b 2" in run.report
    assert len(a.bodies) == len(b.bodies) == 10


def test_an_interrupted_run_resumes_without_asking_again(problems, bench_venv, tmp_path):
    tasks = [0, 2, 13, 23, 38, 53]
    out = tmp_path / "out"
    asked_first, gate, fourth = [], threading.Event(), threading.Event()

    def first_answer(text):
        tid = task_of(text, problems)
        asked_first.append(tid)
        if len(asked_first) == 4:
            fourth.set()
            gate.wait(60)  # held until the eval is killed
        return right(problems[tid])

    with FakeOpenAI(api_key=KEY, answer=first_answer) as fake:
        port = fake.httpd.server_address[1]
        proc = subprocess.Popen(
            eval_cmd(bench_venv, "--url", fake.url, "--tasks", tasks_arg(tasks), "--out", str(out)),
            cwd=REPO,
            env=eval_env(),
            stderr=subprocess.DEVNULL,
        )
        assert fourth.wait(120), "the eval never asked a fourth item"
        proc.send_signal(signal.SIGKILL)  # no chance to clean up: a crash, a lost ssh session
        proc.wait(30)
        gate.set()
    kept = [json.loads(line)["item"] for line in (out / "answers-a.jsonl").read_text().splitlines()]
    assert kept == asked_first[:3]
    asked_second = []

    def second_answer(text):
        asked_second.append(task_of(text, problems))
        return right(problems[asked_second[-1]])

    with FakeOpenAI(api_key=KEY, answer=second_answer, port=port) as fake:  # the same URL: the same endpoint
        done = subprocess.run(
            eval_cmd(bench_venv, "--url", fake.url, "--tasks", tasks_arg(tasks), "--out", str(out)),
            cwd=REPO,
            env=eval_env(),
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stderr
        assert "3 of 6 items already answered" in done.stderr
        assert not set(asked_second) & set(kept) and sorted(asked_second + kept) == sorted(ids(tasks))
        assert asked_first[3] in asked_second  # asked, never answered: asked again
        results = json.loads((out / "results.json").read_text())
        assert results["endpoints"]["a"]["humaneval"]["passed"] == 6
        # the same OUT with other settings is refused before anything is asked
        other = subprocess.run(
            eval_cmd(
                bench_venv, "--url", fake.url, "--tasks", tasks_arg(tasks), "--out", str(out), "--max-tokens", "512"
            ),
            cwd=REPO,
            env=eval_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert other.returncode == 2 and "holds answers of another endpoint or other settings" in other.stderr
    assert len(asked_second) == 3


def test_floor_exit_status_and_missing_bubblewrap(problems, run_eval, tmp_path):
    answer = answering(problems, lambda t, p: wrong(p) if t == "HumanEval/8" else right(p))
    with FakeOpenAI(api_key=KEY, answer=answer) as f:
        run = run_eval("--url", f.url, "--suite", "floor", "--floor", "1.0")
    assert run.returncode == 1 and "below the floor: pass@1 0.952 < 1.00" in run.stderr
    assert "glm-flash-rollback" in run.stderr  # what to do after an engine upgrade
    assert run.results["meta"]["tasks"] == ids(range(0, 164, 8)) and run.results["floor"]["met"] is False
    assert "**NOT met**" in run.report
    bin_dir = tmp_path / "bin"  # setpriv and prlimit, but no bwrap
    bin_dir.mkdir()
    for tool in ("setpriv", "prlimit"):
        (bin_dir / tool).symlink_to(f"/usr/bin/{tool}")
    none = run_eval("--url", "http://127.0.0.1:9", "--tasks", "0", env=eval_env(PATH=str(bin_dir)))
    assert none.returncode == 2 and "bubblewrap (bwrap) or prlimit (and setpriv, run as root) is missing" in none.stderr
