"""What systemd and the disk say about a service: when its last start began, whether its
unit needs a daemon-reload, and when each file it starts from last changed; and which workers the
gateway's router lists."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pyinfra.api import QuoteString, StringCommand

from roles.facts import ParsedFact

# `systemctl show --timestamp=us+utc`: "Tue 2026-12-01 06:12:32.123456 UTC"
_TIMESTAMP = "%a %Y-%m-%d %H:%M:%S.%f UTC"


@dataclass(frozen=True)
class ServiceStart:
    active_state: str = ""  # active, activating, failed, inactive, ...
    need_daemon_reload: bool = False  # a unit file or drop-in changed since systemd loaded it
    last_start: float = 0.0  # when the last start began (left inactive), seconds since the epoch; 0 never
    inputs: dict[str, float] = field(default_factory=dict)  # path -> mtime (of a symlink itself) in seconds

    @property
    def newest_input(self) -> tuple[float, str]:
        return max(((t, p) for p, t in self.inputs.items()), default=(0.0, ""))


def _timestamp(value: str) -> float:
    if not value:
        return 0.0
    return datetime.strptime(value, _TIMESTAMP).replace(tzinfo=UTC).timestamp()


class ServiceStartState(ParsedFact):
    """ServiceStart of `service`, with the mtimes of `paths` (a missing path is left out).

    The last start is InactiveExitTimestamp: the start job left `inactive`/`failed` there,
    before ExecStartPre ran, so every file the start read was read after it. A path changed
    after it is not what the running (or last tried) instance started from.
    """

    def command(self, service: str, paths: list[str], units: list[str] | None = None):
        units = units or [service]
        return StringCommand(
            "systemctl show --timestamp=us+utc -p NeedDaemonReload",
            *[QuoteString(u) for u in units],
            "; systemctl show --timestamp=us+utc -p ActiveState -p InactiveExitTimestamp",
            QuoteString(service),
            "; find -P",
            *[QuoteString(p) for p in paths],
            "-maxdepth 0 -printf 'mtime=%T@ %p\\n' 2>/dev/null; true",
        )

    empty_parsed = True

    @staticmethod
    def parse(lines) -> ServiceStart:
        props: dict[str, str] = {}
        reload, inputs = False, {}
        for line in lines:
            line = line.rstrip("\n")
            m = re.match(r"mtime=(\d+(?:\.\d+)?) (.+)$", line)
            if m:
                inputs[m.group(2)] = float(m.group(1))
            elif line == "NeedDaemonReload=yes":
                reload = True
            elif "=" in line:
                key, _, value = line.partition("=")
                props[key] = value
        return ServiceStart(
            active_state=props.get("ActiveState", ""),
            need_daemon_reload=reload,
            last_start=_timestamp(props.get("InactiveExitTimestamp", "")),
            inputs=inputs,
        )


class SystemdVersion(ParsedFact):
    """The host's systemd major version (`systemctl --version`: "systemd 257 (257.13-1~deb13u1)"); 0 unknown."""

    def command(self):
        return "systemctl --version 2>/dev/null | head -n 1"

    empty_parsed = True

    @staticmethod
    def parse(lines) -> int:
        m = re.match(r"systemd (\d+)", lines[0] if lines else "")
        return int(m.group(1)) if m else 0


class RouterWorkers(ParsedFact):
    """The workers the gateway's router lists now ([{id, url, is_healthy}, ...]), asked on the gateway
    by its own tool (`glm-flash-gateway-launch workers ROUTER_JSON list`: the keys stay in its
    root-only files); None when the router does not answer (not started yet) or the tool is missing."""

    def command(self, tool: str, conf: str):
        return StringCommand(QuoteString(tool), "workers", QuoteString(conf), "list", "2>/dev/null || true")

    @staticmethod
    def parse(lines):
        try:
            answer = json.loads("\n".join(lines))
            return json.loads(answer["body"])["workers"] if answer["status"] == 200 else None
        except (ValueError, KeyError, TypeError):
            return None
