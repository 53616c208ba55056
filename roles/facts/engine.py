"""Facts of the engine interpreter and environments. Commands are POSIX sh (they run before
anything of ours is on the host); parsers are static methods the unit tests feed directly."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from pyinfra.api import FactBase

MARKER = ".glm-flash-complete"


class PythonArtifact(FactBase):
    """sha256 recorded in an unpacked interpreter's completion marker, or None."""

    def command(self, path):
        return f"cat {shlex.quote(path + '/' + MARKER)} 2>/dev/null || true"

    @staticmethod
    def default():
        return None

    def process(self, output):
        words = " ".join(output).split()
        return words[0] if words and re.fullmatch(r"[0-9a-f]{64}", words[0]) else None


class WheelhouseFiles(FactBase):
    """{filename: size} of the host's wheelhouse."""

    def command(self, path):
        q = shlex.quote(path)
        return f"[ -d {q} ] && find {q} -maxdepth 1 -type f -printf '%f %s\\n' || true"

    @staticmethod
    def default():
        return {}

    @staticmethod
    def parse(lines) -> dict[str, int]:
        out = {}
        for line in lines:
            name, _, size = line.strip().rpartition(" ")
            if name and size.isdigit():
                out[name] = int(size)
        return out

    def process(self, output):
        return self.parse(output)


@dataclass(frozen=True)
class EngineState:
    current: str | None = None  # env name `current` points at
    previous: str | None = None
    complete: tuple = ()  # env names holding the completion marker
    present: tuple = ()  # every env directory
    dists: dict = field(default_factory=dict)  # {env: {canonical name: version}} of watched packages

    def version(self, env: str | None, name: str) -> str | None:
        return self.dists.get(env or "", {}).get(name)


# dist-info names we read per environment (cheap: directory names only)
WATCHED = ("nvidia_cudnn_cu12", "transformers_kt", "transformers", "torch", "sglang_kt", "kt_kernel")


class EngineEnvs(FactBase):
    """Which environments exist, which are complete, where current/previous point, and the
    versions of a few packages in each (from dist-info directory names)."""

    def command(self, install_root):
        e = shlex.quote(install_root + "/engine")
        return (
            f"e={e}; for l in current previous; do [ -L $e/$l ] && echo \"link $l $(readlink $e/$l)\"; done; "
            f"for d in $e/envs/*/; do [ -d \"$d\" ] || continue; n=$(basename \"$d\"); echo \"env $n\"; "
            f"[ -f \"$d{MARKER}\" ] && echo \"complete $n\"; "
            f"for i in \"$d\"lib/python3*/site-packages/*.dist-info; do [ -d \"$i\" ] && echo \"dist $n $(basename \"$i\")\"; done; "
            f"done; true"
        )

    @staticmethod
    def default():
        return EngineState()

    @staticmethod
    def parse(lines) -> EngineState:
        links, present, complete, dists = {}, [], [], {}
        for line in lines:
            parts = line.split()
            if len(parts) == 3 and parts[0] == "link":
                links[parts[1]] = parts[2].rstrip("/").rsplit("/", 1)[-1]
            elif len(parts) == 2 and parts[0] == "env":
                present.append(parts[1])
            elif len(parts) == 2 and parts[0] == "complete":
                complete.append(parts[1])
            elif len(parts) == 3 and parts[0] == "dist":
                m = re.fullmatch(r"(.+)-([^-]+)\.dist-info", parts[2])
                if m and m.group(1).lower() in WATCHED:
                    dists.setdefault(parts[1], {})[m.group(1).lower().replace("_", "-")] = m.group(2)
        return EngineState(links.get("current"), links.get("previous"), tuple(complete), tuple(present), dists)

    def process(self, output):
        return self.parse(output)


class TransformersOwner(FactBase):
    """True when every file transformers-kt's RECORD lists under transformers/ is the kt
    fork's (it was the last writer); None without an environment or without transformers-kt."""

    def command(self, env_dir):
        q = shlex.quote(env_dir)
        script = (
            "import base64,csv,glob,hashlib,os,sys\n"
            "sp=glob.glob(sys.argv[1]+'/lib/python3*/site-packages')[0]\n"
            "d=glob.glob(sp+'/transformers_kt-*.dist-info')\n"
            "if not d: print('none'); sys.exit()\n"
            "bad=0\n"
            "for row in csv.reader(open(d[0]+'/RECORD',newline='')):\n"
            "  p,h=row[0],row[1]\n"
            "  if not h or not p.startswith('transformers/') or p.endswith('.pyc'): continue\n"
            "  try: g='sha256='+base64.urlsafe_b64encode(hashlib.sha256(open(os.path.join(sp,p),'rb').read()).digest()).rstrip(b'=').decode()\n"
            "  except OSError: g=''\n"
            "  bad+=g!=h\n"
            "print('mismatch %d' % bad)\n"
        )
        return f"[ -x {q}/bin/python ] && {q}/bin/python -I -c {shlex.quote(script)} {q} 2>/dev/null || echo none"

    @staticmethod
    def default():
        return None

    def process(self, output):
        words = " ".join(output).split()
        if words[:1] == ["mismatch"] and len(words) > 1 and words[1].isdigit():
            return int(words[1]) == 0
        return None
