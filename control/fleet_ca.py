"""The fleet's own certificate authority, kept on the control machine: it signs the gateway's TLS
certificate, and clients trust the fleet's gateway by its certificate (`ca.crt`) alone.

    $GLM_FLASH_FLEET_CA, else ${XDG_CONFIG_HOME:-~/.config}/glm-flash/fleet-ca/
        ca.key, ca.crt              the authority (made on first use; EC P-256, 10 years)
        issued/<host>.key, .crt     each gateway's certificate (397 days; issued again when its
                                    names change, when less than 30 days are left, or when the
                                    authority changed)

The authority's key signs what every client of the fleet trusts, so the directory is held to the
rule for what the control machine keeps for root: a real directory (not a link) owned by the
user running the deploy, closed to group and others, every key file the same. Anything else is
refused, with what to do, before any host is contacted. Files are written whole (a temporary name,
fsync, rename), so a run killed while it writes leaves the old file or the new, never half of one.
A certificate that is still good is used as it is, so a second run changes nothing on the gateway.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from control.fleet import is_ip
from control.pypi_cache import write_whole

CA_DAYS = 3650
LEAF_DAYS = 397  # what browsers accept for a server certificate
RENEW_DAYS = 30
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}")


class CAError(Exception):
    """The authority's directory cannot be trusted or written: (what, fix)."""

    def __init__(self, problem: str, fix: str):
        super().__init__(problem)
        self.problem, self.fix = problem, fix


@dataclass(frozen=True)
class Issued:
    cert_pem: bytes
    key_pem: bytes
    ca_pem: bytes
    ca_path: Path


def ca_dir() -> Path:
    explicit = os.environ.get("GLM_FLASH_FLEET_CA")
    if explicit:
        return Path(explicit).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(config) / "glm-flash" / "fleet-ca"


def _private_dir(path: Path) -> None:
    """Made 0700 when missing; refused when it is a link, someone else's, or open to others."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(path)
    except OSError as e:
        raise CAError(f"{path} cannot be made ({e.strerror})", "give the deploy's user a writable home") from None
    fix = f"chown {os.getuid()} {path} && chmod 700 {path} (or move it aside to start a new authority)"
    if not stat.S_ISDIR(st.st_mode):
        raise CAError(f"{path} is not a directory (a link or a file)", fix)
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise CAError(f"{path} is owned by uid {st.st_uid} with mode {st.st_mode & 0o777:o}", fix)


def _read(path: Path, secret: bool) -> bytes | None:
    """A file of the authority's, or None when missing; refused when not a plain file of ours (and,
    for a key, closed to others)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise CAError(f"{path} cannot be read ({e.strerror})", f"remove {path}; it is made again") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        bad_mode = st.st_mode & (0o077 if secret else 0o022)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or bad_mode:
            raise CAError(
                f"{path} is not a plain file of uid {os.getuid()} closed to others (uid {st.st_uid}, "
                f"mode {st.st_mode & 0o777:o})",
                f"chown {os.getuid()} {path} && chmod {'600' if secret else '644'} {path}",
            )
        return f.read()


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def authority(directory: Path | None = None) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate, Path]:
    """The fleet's authority: its key, its certificate and the certificate's path (made on first use)."""
    d = directory or ca_dir()
    _private_dir(d)
    key_pem, cert_pem = _read(d / "ca.key", secret=True), _read(d / "ca.crt", secret=False)
    if key_pem is None and cert_pem is not None:
        raise CAError(
            f"{d} holds the authority's certificate without its key (ca.key is missing)",
            f"restore {d / 'ca.key'} from a backup, or move {d} aside to start a new authority "
            "(every client then needs the new ca.crt)",
        )
    if key_pem is None:  # the key first: a run killed before the certificate is written makes it next time
        key_pem = _key_pem(ec.generate_private_key(ec.SECP256R1()))
        write_whole(d / "ca.key", key_pem, 0o600, sync=True)
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
        cert = x509.load_pem_x509_certificate(cert_pem) if cert_pem is not None else None
    except ValueError as e:
        raise CAError(f"{d}: ca.key or ca.crt is not PEM ({e})", f"move {d} aside to start a new authority") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CAError(f"{d}: ca.key is not an EC key of ours", f"move {d} aside to start a new authority")
    if cert is None:
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"glm-flash fleet CA {os.urandom(4).hex()}")])
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        write_whole(d / "ca.crt", cert.public_bytes(serialization.Encoding.PEM), 0o644, sync=True)
    if key.public_key() != cert.public_key():
        raise CAError(f"{d}: ca.key is not the key of ca.crt", f"move {d} aside to start a new authority")
    return key, cert, d / "ca.crt"


def _names(names: list[str]) -> list[x509.GeneralName]:
    return [x509.IPAddress(ipaddress.ip_address(n)) if is_ip(n) else x509.DNSName(n) for n in sorted(set(names))]


def _current(cert_pem: bytes, ca: x509.Certificate, wanted: list[x509.GeneralName]) -> bool:
    """The issued certificate is the authority's, names exactly `wanted` and has RENEW_DAYS left."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        cert.verify_directly_issued_by(ca)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, TypeError, x509.ExtensionNotFound, InvalidSignature):
        return False
    left = cert.not_valid_after_utc - _now()
    return set(sans) == set(wanted) and left > datetime.timedelta(days=RENEW_DAYS)


def issue(host: str, names: list[str], directory: Path | None = None) -> Issued:
    """The gateway `host`'s certificate for `names` (its addresses and DNS names), from the fleet's
    authority: the one already issued while it is still good, else a new key and certificate."""
    bad = [n for n in names if not NAME.fullmatch(n) and not is_ip(n)]
    if bad or not names:
        raise CAError(f"the gateway's names {bad or names!r} are not host names or IP addresses", "fix them")
    key, ca, ca_path = authority(directory)
    d = ca_path.parent / "issued"
    _private_dir(d)
    stem = re.sub(r"[^A-Za-z0-9.-]", "_", host)
    wanted = _names(names)
    cert_pem, key_pem = _read(d / f"{stem}.crt", secret=False), _read(d / f"{stem}.key", secret=True)
    ca_pem = ca.public_bytes(serialization.Encoding.PEM)
    if cert_pem is not None and key_pem is not None and _current(cert_pem, ca, wanted):
        leaf_key = serialization.load_pem_private_key(key_pem, password=None)
        if leaf_key.public_key() == x509.load_pem_x509_certificate(cert_pem).public_key():
            return Issued(cert_pem, key_pem, ca_pem, ca_path)
    leaf = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"glm-flash gateway {host}"[:64])]))
        .issuer_name(ca.subject)
        .public_key(leaf.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=LEAF_DAYS))
        .add_extension(x509.SubjectAlternativeName(wanted), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem, cert_pem = _key_pem(leaf), cert.public_bytes(serialization.Encoding.PEM)
    write_whole(d / f"{stem}.key", key_pem, 0o600, sync=True)
    write_whole(d / f"{stem}.crt", cert_pem, 0o644, sync=True)
    return Issued(cert_pem, key_pem, ca_pem, ca_path)
