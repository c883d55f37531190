"""``qstate certs``: a local CA and a server certificate it signs, for development and tests.

Production certificates come from the operator's own CA (cert-manager, Vault ...); this makes
the same files for a laptop: ``ca.pem`` (what callers trust, ``QSTATE_TLS_CA``),
``server.pem`` and ``server-key.pem`` (``QSTATE_TLS_CERT``/``QSTATE_TLS_KEY``) valid for
127.0.0.1, ::1, localhost and every ``--host`` given. Keys are written mode 0600.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from qstate.core.transport.files import write_file

__all__ = ["CertFiles", "make_certs"]

LOCAL_NAMES = ("127.0.0.1", "::1", "localhost")


@dataclass(frozen=True)
class CertFiles:
    ca: Path
    cert: Path
    key: Path

    def env_lines(self) -> str:
        return (f"QSTATE_TLS_CERT={self.cert}\nQSTATE_TLS_KEY={self.key}\n"
                f"QSTATE_TLS_CA={self.ca}")


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "qstate development"),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _san(hosts: list[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for h in dict.fromkeys([*LOCAL_NAMES, *hosts]):
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            entries.append(x509.DNSName(h))
    return x509.SubjectAlternativeName(entries)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_certs(out: Path, hosts: list[str], days: int = 365) -> CertFiles:
    """A new CA and a server certificate for ``hosts`` (plus the loopback names) in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name("qstate development CA"))
          .issuer_name(_name("qstate development CA")).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(minutes=5))
          .not_valid_after(now + dt.timedelta(days=days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                       crl_sign=True, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False,
                                       decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name("qstate server"))
            .issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(_san(hosts), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    files = CertFiles(out / "ca.pem", out / "server.pem", out / "server-key.pem")
    write_file(files.ca, ca.public_bytes(serialization.Encoding.PEM), secret=False)
    write_file(out / "ca-key.pem", _key_pem(ca_key), secret=True)
    write_file(files.cert, cert.public_bytes(serialization.Encoding.PEM), secret=False)
    write_file(files.key, _key_pem(key), secret=True)
    return files
