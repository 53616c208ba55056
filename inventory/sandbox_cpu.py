"""The built-in sandbox serving: platform `cpu`, vLLM's CPU build serving a tiny Llama
(sandbox/tiny_model.py) that the sandbox's stand-in hub serves under its own repo and commit
(its model lock: model_id and model_revision below, from .sandbox/hub/hub.json).

    .venv/bin/pyinfra -y inventory/sandbox_cpu.py deploy.py      (make demo runs it)

Everything else is inventory/sandbox.py's machine and settings. The engine is real (the deployed
unit runs it, readiness waits for its completions); the model is random weights and answers
gibberish. Deployed after inventory/sandbox.py on the same machine, it builds its environment
beside the L40S one and switches `current` (glm-flash-rollback goes back).
"""

import runpy
from pathlib import Path

from control.profile import hosts

base = runpy.run_path(str(Path(__file__).resolve().parent / "sandbox.py"))
(name, data), tiny = base["hosts"][0], base["hub"]["tiny"]

hosts = hosts(
    (
        name,
        {
            **data,
            "platform": "cpu",
            "model_id": tiny["repo"],
            "model_revision": tiny["commit"],
            "model_path": "/srv/models/tiny-llama",
        },
    ),
)
