"""Facts the driver role reads: NVIDIA PCI devices, the loaded and the on-disk kernel
module, running and installed kernels, and Debian's reboot-required flag.

GPU inventory through nvidia-smi and the CUDA toolkits are in roles/facts/system.py (Gpus,
CudaToolkits); these facts work before any driver is installed. Parsers are static
methods so unit tests feed them real command output.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from pyinfra.api import QuoteString, StringCommand

from roles.facts import ParsedFact, fields, flags

_NUMBERS = re.compile(r"\d+|\D+")


def version_key(version: str) -> tuple:
    """Order Debian-style version strings well enough for kernels and driver builds:
    digit runs compare as numbers ("6.12.41" > "6.12.9"), an epoch sorts first."""
    epoch, _, rest = version.rpartition(":") if re.match(r"^\d+:", version) else ("0", "", version)
    return (int(epoch or 0),) + tuple((0, int(p)) if p.isdigit() else (1, p) for p in _NUMBERS.findall(rest))


def upstream_version(debian_version: str) -> str:
    """580.95.05-1 -> 580.95.05; 1:550.163.01-2 -> 550.163.01."""
    v = re.sub(r"^\d+:", "", debian_version)
    return v.rsplit("-", 1)[0] if "-" in v else v


def version_at_least(version: str, minimum: str) -> bool:
    return version_key(upstream_version(version)) >= version_key(upstream_version(minimum))


@dataclass(frozen=True)
class PciDevice:
    address: str
    device_id: str
    pci_class: str


class NvidiaPciDevices(ParsedFact):
    """NVIDIA display/3D controllers on the PCI bus (vendor 0x10de, class 0x03xxxx).

    Read from sysfs, so it answers before any driver or pciutils is installed.
    """

    def command(self):
        return (
            "for d in /sys/bus/pci/devices/*; do [ -r \"$d/vendor\" ] || continue; "
            "echo \"${d##*/} $(cat \"$d/vendor\") $(cat \"$d/device\") $(cat \"$d/class\")\"; done; true"
        )

    empty_parsed = True

    @staticmethod
    def parse(lines) -> list[PciDevice]:
        return [
            PciDevice(address, device.lower(), pci_class.lower())
            for address, vendor, device, pci_class in fields(lines, 4)
            if vendor.lower() == "0x10de" and pci_class.lower().startswith("0x03")
        ]


@dataclass(frozen=True)
class LoadedModule:
    version: str
    open: bool  # NVIDIA's open kernel modules ("Open Kernel Module")


class NvidiaLoadedModule(ParsedFact):
    """The nvidia kernel module running now (/proc/driver/nvidia/version), or None."""

    def command(self):
        return "cat /proc/driver/nvidia/version 2>/dev/null || true"

    @staticmethod
    def parse(lines) -> LoadedModule | None:
        for line in lines:
            if not line.startswith("NVRM version:"):
                continue
            m = re.search(r"\s(\d{3}\.\d+(?:\.\d+)?)\s", line + " ")
            if m:
                return LoadedModule(m.group(1), "Open Kernel Module" in line)
        return None


class NvidiaModuleOnDisk(ParsedFact):
    """Version of the nvidia module the running kernel would load (`modinfo`), or None.

    DKMS builds it for each kernel with headers; None on a running kernel means the
    build did not happen (missing headers, failed build) or no driver is installed.
    """

    def command(self):
        return "modinfo -F version nvidia 2>/dev/null || true"

    @staticmethod
    def parse(lines) -> str | None:
        for line in lines:
            line = line.strip()
            if re.match(r"^\d{3}\.\d+(\.\d+)?$", line):
                return line
        return None


@dataclass(frozen=True)
class KernelState:
    running: str
    installed: tuple[str, ...]  # releases with a /boot/vmlinuz-*, oldest first

    @property
    def newest(self) -> str | None:
        return self.installed[-1] if self.installed else None

    @property
    def newer_installed(self) -> str | None:
        """The newest installed kernel when it is not the running one (a reboot would switch)."""
        newest = self.newest
        if newest and newest != self.running and version_key(newest) > version_key(self.running):
            return newest
        return None


class Kernels(ParsedFact):
    """Running kernel release and the kernels installed under /boot."""

    def command(self):
        return "echo \"running $(uname -r)\"; for f in /boot/vmlinuz-*; do [ -e \"$f\" ] && echo \"installed ${f#/boot/vmlinuz-}\"; done; true"

    @staticmethod
    def parse(lines) -> KernelState:
        running, installed = "", []
        for line in lines:
            kind, _, release = line.strip().partition(" ")
            if kind == "running":
                running = release
            elif kind == "installed" and release:
                installed.append(release)
        return KernelState(running, tuple(sorted(set(installed), key=version_key)))


class KernelHeaders(ParsedFact):
    """Kernel releases whose headers are installed: `/lib/modules/K/build` leads to a
    directory, which is where DKMS looks for them (dkms's kernel_source_dir)."""

    def command(self):
        return "for d in /lib/modules/*/build; do [ -d \"$d/\" ] && { d=${d%/build}; echo \"${d##*/}\"; }; done; true"

    empty_parsed = True

    @staticmethod
    def parse(lines) -> frozenset[str]:
        return frozenset(line.strip() for line in lines if line.strip())


@dataclass(frozen=True)
class RebootFlag:
    required: bool
    packages: tuple[str, ...]


class RebootRequired(ParsedFact):
    """Debian/Ubuntu's /run/reboot-required flag and the packages that set it."""

    def command(self):
        return "if [ -e /run/reboot-required ]; then echo required; cat /run/reboot-required.pkgs 2>/dev/null; fi; true"

    empty_parsed = True

    @staticmethod
    def parse(lines) -> RebootFlag:
        lines = [line.strip() for line in lines if line.strip()]
        if not lines or lines[0] != "required":
            return RebootFlag(False, ())
        return RebootFlag(True, tuple(dict.fromkeys(lines[1:])))


class NvidiaRepoState(ParsedFact):
    """`glm-flash-nvidia-repo status`: the keyring's primary fingerprints (None when there is
    no keyring) and whether the sources file is the one the tool writes; None as a whole when
    the tool is not on the host yet (a first deploy installs it earlier in the same run)."""

    def command(self, tool: str, repo: str, keyring: str, sources: str):
        q = QuoteString(tool)
        options = flags(repo=repo, keyring=keyring, sources=sources)
        return StringCommand("if [ -x", q, "]; then", q, "status", *options, "; else echo missing; fi")

    @staticmethod
    def parse(lines) -> dict | None:
        text = "\n".join(lines).strip()
        if not text or text == "missing":
            return None
        return json.loads(text)


class AptVersions(ParsedFact):
    """Versions of a package apt can install (`apt-cache madison`), newest first; [] if none."""

    def command(self, package: str):
        return StringCommand("apt-cache madison", QuoteString(package), "2>/dev/null || true")

    empty_parsed = True

    @staticmethod
    def parse(lines) -> list[str]:
        rows = ([p.strip() for p in line.split("|")] for line in lines)
        return list(dict.fromkeys(parts[1] for parts in rows if len(parts) >= 3))


class NvidiaModuleFor(NvidiaModuleOnDisk):
    """Version of the nvidia module built for kernel release `kernel` (None when there is none)."""

    def command(self, kernel: str):
        return StringCommand("modinfo -k", QuoteString(kernel), "-F version nvidia 2>/dev/null || true")


@dataclass(frozen=True)
class SecureBootState:
    enabled: bool
    key_exists: bool  # DKMS's signing certificate
    enrolled: bool  # known to the firmware (mokutil --test-key)


class SecureBoot(ParsedFact):
    """Secure Boot from the firmware's SecureBoot variable (its last byte is 1 when on), and
    whether DKMS's module signing key `mok` exists and is enrolled."""

    def command(self, mok: str):
        q = QuoteString(mok)
        key = StringCommand("[ -e", q, "] && echo key;")
        enrolled = StringCommand("command -v mokutil >/dev/null && [ -e", q, "] && mokutil --test-key", q)
        return StringCommand(
            "v=$(ls /sys/firmware/efi/efivars/SecureBoot-* 2>/dev/null | head -n1);",
            "if [ -n \"$v\" ]; then echo \"sb $(od -An -tu1 \"$v\" | awk '{print $NF}')\"; fi;",
            key,
            enrolled,
            "2>&1 | head -n1; true",
        )

    empty_parsed = True

    @staticmethod
    def parse(lines) -> SecureBootState:
        enabled = key = enrolled = False
        for line in lines:
            line = line.strip()
            if line.startswith("sb "):
                enabled = line.split()[-1] == "1"
            elif line == "key":
                key = True
            elif "is already enrolled" in line:
                enrolled = True
        return SecureBootState(enabled, key, enrolled)
