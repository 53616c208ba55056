"""Facts of the model role: what glm-flash-model-fetch says about a checkpoint, and the
downloader environment's marker."""

from __future__ import annotations

import contextlib
import json

from pyinfra.api import QuoteString, StringCommand

from roles.facts import ParsedFact


def check_as_owner(tool: str, dest: str, repo: str = "", revision: str = "", hint: str = "") -> StringCommand:
    """`glm-flash-model-fetch check` of `dest` as root starts it. The tool checks with the rights of
    the user who owns the tree's top directory (root only for root's tree): while the downloader's
    user owns the checkpoint (from unseal to seal), root neither opens its files nor parses its
    JSON (the tool's check says how). `hint`: what the tool says on stderr when the check fails."""
    q = QuoteString
    argv = ["python3 -E -s", q(tool), "check --dest", q(dest)]
    argv += ["--repo", q(repo), "--revision", q(revision)] if repo else []
    return StringCommand(*argv, *(["--hint", q(hint)] if hint else []))


class ModelCheck(ParsedFact):
    """`glm-flash-model-fetch check` (check_as_owner): {"exit", "state", "reason", "commit", "sealed"}
    (exit None: the tool is not there yet)."""

    def command(self, tool: str, dest: str, repo: str = "", revision: str = ""):
        return StringCommand(
            "if [ -e",
            QuoteString(tool),
            "]; then",
            check_as_owner(tool, dest, repo, revision),
            '; echo "exit=$?"; else echo missing; fi',
        )

    @staticmethod
    def default():
        return {"exit": None, "state": "unknown", "reason": "the check tool is not installed yet", "sealed": False}

    @staticmethod
    def parse(lines) -> dict:
        lines = [line.strip() for line in lines if line.strip()]
        if lines == ["missing"]:
            return ModelCheck.default()
        out = {"exit": None, "state": "unknown", "reason": " ".join(lines), "commit": "", "sealed": False}
        for line in lines:
            if line.startswith("exit="):
                out["exit"] = int(line[5:])
            elif line.startswith("{"):
                with contextlib.suppress(ValueError):
                    out.update(json.loads(line))
        return out


class DownloaderMarker(ParsedFact):
    """The downloader venv's marker (the sha256 of the requirements it was built from), or ""."""

    def command(self, marker: str):
        return StringCommand("cat", QuoteString(marker), "2>/dev/null || true")

    empty_parsed = True

    @staticmethod
    def parse(lines) -> str:
        return "".join(lines).strip()


class UnitActive(ParsedFact):
    """`systemctl is-active UNIT`: active, activating, inactive, failed, ..."""

    def command(self, unit: str):
        return StringCommand("systemctl is-active", QuoteString(unit), "|| true")

    empty_parsed = True

    @staticmethod
    def parse(lines) -> str:
        return "".join(lines).strip() or "inactive"
