"""A throw-away certificate authority, server and client certificates made with the openssl CLI."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TlsFiles", "make_tls_files"]


@dataclass(frozen=True)
class TlsFiles:
    """PEM files: the CA, a server certificate for 127.0.0.1/localhost, a client certificate."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _signed(name: str, subject: str, extensions: str, cwd: Path) -> tuple[Path, Path]:
    """A key and a certificate for ``subject`` signed by the CA in ``cwd``."""
    (cwd / f"{name}.ext").write_text(extensions + "\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", "-subj", subject, cwd=cwd)  # fmt: skip
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "2", "-out", f"{name}.pem",
             "-extfile", f"{name}.ext", cwd=cwd)  # fmt: skip
    return cwd / f"{name}.pem", cwd / f"{name}.key"


def make_tls_files(directory: Path) -> TlsFiles:
    """Generate a fresh CA and certificates under ``directory`` (needs ``openssl`` on PATH)."""
    if shutil.which("openssl") is None:
        raise RuntimeError("the openssl command line tool is not installed")
    directory.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
             "-out", "ca.pem", "-days", "2", "-subj", "/CN=celery_interval test CA",
             cwd=directory)  # fmt: skip
    server_cert, server_key = _signed(
        "server",
        "/CN=localhost",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth",
        directory,
    )
    client_cert, client_key = _signed(
        "client", "/CN=celery-interval-worker", "extendedKeyUsage=clientAuth", directory
    )
    return TlsFiles(directory / "ca.pem", server_cert, server_key, client_cert, client_key)
