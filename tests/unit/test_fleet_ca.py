"""The fleet's authority on the control machine (control/fleet_ca.py): the gateway's certificate is
checked by a real TLS handshake (Python's ssl, OpenSSL underneath) against the authority's
certificate, as a client of the fleet checks it; the directory's trust rules are shown refusing."""

from __future__ import annotations

import os
import socket
import ssl
import threading

import pytest

from control import fleet_ca


def handshake(issued: fleet_ca.Issued, tmp_path, name: str, cafile=None) -> str:
    """'' when a client trusting `cafile` (default: the fleet's ca.crt) accepts the server's
    certificate for `name`, else OpenSSL's reason."""
    (tmp_path / "srv.crt").write_bytes(issued.cert_pem)
    (tmp_path / "srv.key").write_bytes(issued.key_pem)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp_path / "srv.crt", tmp_path / "srv.key")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve():
        conn, _ = listener.accept()
        try:
            with server.wrap_socket(conn, server_side=True) as tls:
                tls.recv(1)
        except (ssl.SSLError, OSError):
            pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    client = ssl.create_default_context(cafile=str(cafile or issued.ca_path))
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            with client.wrap_socket(raw, server_hostname=name) as tls:
                tls.sendall(b"x")
        return ""
    except ssl.SSLCertVerificationError as e:
        return e.verify_message
    finally:
        t.join(timeout=10)
        listener.close()


def test_the_gateways_certificate_is_trusted_by_the_authority_for_its_names_only(tmp_path):
    issued = fleet_ca.issue("gw", ["10.0.0.5", "127.0.0.1", "llm.lan"], tmp_path / "ca")
    assert handshake(issued, tmp_path, "10.0.0.5") == ""
    assert handshake(issued, tmp_path, "127.0.0.1") == ""
    assert handshake(issued, tmp_path, "llm.lan") == ""
    assert "mismatch" in handshake(issued, tmp_path, "other.lan")
    # Another authority's clients do not trust it.
    other = fleet_ca.issue("gw", ["10.0.0.5"], tmp_path / "other")
    assert "unable to get local issuer certificate" in handshake(issued, tmp_path, "10.0.0.5", other.ca_path)


def test_a_second_run_reuses_what_is_still_good_and_issues_again_when_the_names_change(tmp_path):
    d = tmp_path / "ca"
    first = fleet_ca.issue("gw", ["10.0.0.5"], d)
    assert fleet_ca.issue("gw", ["10.0.0.5"], d) == first  # the same bytes: the gateway is not changed
    assert (d.stat().st_mode & 0o777, (d / "ca.key").stat().st_mode & 0o777) == (0o700, 0o600)
    assert (d / "issued" / "gw.key").stat().st_mode & 0o777 == 0o600
    renamed = fleet_ca.issue("gw", ["10.0.0.5", "llm.lan"], d)
    assert renamed.cert_pem != first.cert_pem and renamed.key_pem != first.key_pem
    assert renamed.ca_pem == first.ca_pem  # the clients' trust is unchanged
    assert handshake(renamed, tmp_path, "llm.lan") == ""


def test_a_certificate_near_its_end_is_issued_again(tmp_path, monkeypatch):
    d = tmp_path / "ca"
    first = fleet_ca.issue("gw", ["10.0.0.5"], d)
    monkeypatch.setattr(fleet_ca, "RENEW_DAYS", fleet_ca.LEAF_DAYS + 1)  # every certificate is "near its end"
    assert fleet_ca.issue("gw", ["10.0.0.5"], d).cert_pem != first.cert_pem


def test_a_key_that_is_not_the_certificates_is_replaced(tmp_path):
    """A run killed between the key and the certificate leaves a pair that does not match."""
    d = tmp_path / "ca"
    fleet_ca.issue("gw", ["10.0.0.5"], d)
    other = fleet_ca.issue("gw2", ["10.0.0.5"], d)
    (d / "issued" / "gw.key").write_bytes(other.key_pem)
    again = fleet_ca.issue("gw", ["10.0.0.5"], d)
    assert again.key_pem != other.key_pem and handshake(again, tmp_path, "10.0.0.5") == ""


def test_an_authority_killed_before_its_certificate_is_made_whole_and_one_without_its_key_is_refused(tmp_path):
    d = tmp_path / "ca"
    fleet_ca.issue("gw", ["10.0.0.5"], d)
    (d / "ca.crt").unlink()  # the key is written first: this is what a kill between the two leaves
    issued = fleet_ca.issue("gw", ["10.0.0.5"], d)
    assert (d / "ca.crt").exists() and handshake(issued, tmp_path, "10.0.0.5") == ""
    (d / "ca.key").unlink()
    with pytest.raises(fleet_ca.CAError, match="without its key"):
        fleet_ca.issue("gw", ["10.0.0.5"], d)


@pytest.mark.parametrize("breach", ["dir-group", "dir-link", "key-mode", "cert-writable", "dir-owner"])
def test_a_directory_others_could_write_or_read_is_refused(tmp_path, breach):
    d = tmp_path / "ca"
    fleet_ca.issue("gw", ["10.0.0.5"], d)
    if breach == "dir-group":
        d.chmod(0o750)
    elif breach == "dir-link":
        (tmp_path / "link").symlink_to(d)
        d = tmp_path / "link"
    elif breach == "key-mode":
        (d / "ca.key").chmod(0o640)
    elif breach == "cert-writable":
        (d / "issued" / "gw.crt").chmod(0o666)
    elif breach == "dir-owner":
        if os.getuid() != 0:
            pytest.skip("not applicable: giving the directory to another user needs root")
        os.chown(d, 65534, 65534)
    with pytest.raises(fleet_ca.CAError) as e:
        fleet_ca.issue("gw", ["10.0.0.5"], d)
    assert str(d) in e.value.problem and e.value.fix


def test_names_that_are_no_host_name_are_refused(tmp_path):
    with pytest.raises(fleet_ca.CAError, match="not host names"):
        fleet_ca.issue("gw", ["10.0.0.5", "bad name;"], tmp_path / "ca")


def test_the_directory_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("GLM_FLASH_FLEET_CA", str(tmp_path / "mine"))
    assert fleet_ca.ca_dir() == tmp_path / "mine"
    monkeypatch.delenv("GLM_FLASH_FLEET_CA")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    assert fleet_ca.ca_dir() == tmp_path / "cfg" / "glm-flash" / "fleet-ca"
