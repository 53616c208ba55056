"""At -vvv pyinfra prints every command and every fact's output: nothing of a secret may be in it.

roles/operations/secrets.py's secret_file puts a canary key on the sandbox (first run: staged,
renamed into place) and finds it in place (second run: compared on the host, a no-op), both at
-vvv through the real pyinfra CLI. Neither output holds the key, its base64 (what the host's
comparison reads on stdin) or any common hash of it: a hash printed there lets a short key be
guessed offline.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import secrets
import subprocess
import sys

import pytest

from tests.conftest import REPO, SANDBOX_INVENTORY, sandbox_sh

pytestmark = pytest.mark.sandbox

DIR = "/root/glm-flash-vvv-test"
DEPLOY = f"""
import os
from roles.operations.secrets import Secret, secret_file

secret_file(
    name="Canary secret", dest="{DIR}/key", secret=Secret(os.environ["VVV_KEY"]), stage_dir="{DIR}/stage"
)
"""


def derived(key: str) -> list[str]:
    raw = key.encode()
    out = [key, base64.b64encode(raw).decode()]
    for algo in ("md5", "sha1", "sha224", "sha256", "sha384", "sha512", "blake2b", "sha3_256"):
        digest = hashlib.new(algo, raw)
        out += [digest.hexdigest(), base64.b64encode(digest.digest()).decode()]
    return out


def test_vvv_shows_nothing_of_the_secret(sandbox, tmp_path):
    key = "sk-canary-" + secrets.token_hex(4)  # short: what an offline guess would find
    deploy = tmp_path / "secret_deploy.py"
    deploy.write_text(DEPLOY)
    sandbox_sh(f"rm -rf {DIR} && install -d -m 700 {DIR}")
    outputs = []
    for run in range(2):
        # An empty facts cache per run: every fact is read alone, so -vvv prints each one's output.
        cache = tmp_path / f"cache{run}"
        cache.mkdir(mode=0o700)
        env = dict(os.environ, VVV_KEY=key, PYTHONPATH=str(REPO), GLM_FLASH_CACHE=str(cache))
        r = subprocess.run(
            [sys.executable, "-m", "pyinfra", "-y", "-vvv", SANDBOX_INVENTORY, str(deploy)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
        outputs.append(r.stdout + r.stderr)
        assert r.returncode == 0, outputs[-1][-4000:]
    first, second = outputs
    assert sandbox_sh(f"cat {DIR}/key").stdout == key  # the runs did put it there
    assert "holds the secret (compared on the host" in second, second[-3000:]
    # -vvv printed the commands and the facts' output
    # (through the sudo user of inventory/sandbox.py, pyinfra prints `>>> sudo -H -n sh -c ...`)
    assert re.search(r"\[sandbox\] >>> (sudo [^\n]*?)?sh -c", first) and "Loaded fact files.File" in second
    for out in outputs:
        shown = [d for d in derived(key) if d in out]
        assert shown == [], f"the -vvv output holds {shown}"
    sandbox_sh(f"rm -rf {DIR}")
