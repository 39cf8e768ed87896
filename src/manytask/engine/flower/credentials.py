"""Credentials for a loopback federation: a CA and a SuperLink certificate for 127.0.0.1 (TLS), and the SuperNodes'
key pairs for Flower's SuperNode authentication (NIST P-384 keys in OpenSSH format: `flower-supernode
--auth-supernode-private-key` reads the private one, `flwr supernode register` the public one). Made with
`cryptography` (Flower's own dependency); for trying a deployment on one machine, not for production keys."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TLSFiles:
    """PEM files: the CA certificate clients trust, and the SuperLink's certificate and key."""

    ca_cert: Path
    server_cert: Path
    server_key: Path


@dataclass(frozen=True)
class NodeKey:
    """A SuperNode's key pair: the private key it signs with, the public key the SuperLink registers."""

    private: Path
    public: Path


def write_loopback_certificates(directory: Path, days: int = 30) -> TLSFiles:
    """A CA and a SuperLink certificate for 127.0.0.1 and localhost, valid for `days`: ca.crt, server.pem and
    server.key in `directory` (the layout `local-cluster --tls-dir` reads)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def certificate(subject: str, issuer: x509.Name, key, signer, extensions) -> x509.Certificate:
        builder = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(issuer).public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=days)))
        for extension, critical in extensions:
            builder = builder.add_extension(extension, critical=critical)
        return builder.sign(signer, hashes.SHA256())

    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "manytask-loopback-ca")])
    authority = [(x509.BasicConstraints(ca=True, path_length=None), True)]
    ca = certificate("manytask-loopback-ca", ca_name, ca_key, ca_key, authority)
    names = x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    server = certificate("localhost", ca_name, server_key, ca_key,
                         [(names, False), (x509.BasicConstraints(ca=False, path_length=None), True)])
    directory.mkdir(parents=True, exist_ok=True)
    files = TLSFiles(directory / "ca.crt", directory / "server.pem", directory / "server.key")
    files.ca_cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files.server_cert.write_bytes(server.public_bytes(serialization.Encoding.PEM))
    files.server_key.write_bytes(server_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    files.server_key.chmod(0o600)
    return files


def write_node_key(directory: Path, name: str) -> NodeKey:
    """A P-384 key pair for one SuperNode: `name` (OpenSSH private key, mode 600) and `name.pub` in `directory`."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1())
    directory.mkdir(parents=True, exist_ok=True)
    pair = NodeKey(directory / name, directory / f"{name}.pub")
    pair.private.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()))
    pair.private.chmod(0o600)
    pair.public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b"\n")
    return pair
