"""`hitoban federate keys`: what keeps strangers out of a federated run, made with `cryptography` (Flower needs it).

  KEYS/ca.crt, ca.key          the run's own certificate authority (keep ca.key on the server machine, or offline)
  KEYS/server.crt, server.key  the server's TLS certificate, valid for the names and IPs given (--host)
  KEYS/nodes/NAME.pub          each machine's public key, in the format Flower's SuperNode authentication reads
                               (an EC SECP384R1 key in OpenSSH format); `serve --keys KEYS` registers every one
  KEYS/node-NAME/              what a machine takes with it: ca.crt and its private key (node.key)

A machine joins with `--keys node-NAME` (copied to it); a machine whose key is not registered is refused by the
server's SuperLink before it can receive the model.
Lazy imports: `cryptography.exceptions` only where a key is read back."""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from hitoban.errors import UsageError
from hitoban.options import checked_against
from hitoban.provenance import replacing
from hitoban.training.federated.options import KeysOptions


def _write(path: Path, data: bytes, private: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path) as tmp:
        if private:
            os.chmod(tmp, 0o600)  # before the key is in it
        tmp.write_bytes(data)


def _pem_key(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _certificate(subject: str, key, issuer_name: x509.Name, issuer_key, days: int, ca: bool,
                 hosts: list[str] = ()) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
               .issuer_name(issuer_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days)))
    builder = builder.add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
            decipher_only=False), critical=True)
    else:
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    if hosts:
        names = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


@checked_against(KeysOptions, "days")
def make_keys(out: str | os.PathLike, machines: list[str], hosts: list[str], days: int = 365) -> dict:
    """The CA, the server's certificate and one key pair per machine. On a folder that already has a CA, only the
    new machines' key pairs are made (signed by nothing: the server registers their public keys), so machines can
    be added to a running setup; an existing machine's keys are never overwritten."""
    out = Path(out)
    bad = [m for m in machines if not m or "/" in m or m.startswith(".")]
    if bad or len(set(machines)) != len(machines):
        raise UsageError(f"--machine names must be distinct and plain (no '/'): {machines}")
    taken = [m for m in machines if (out / f"node-{m}").exists() or (out / "nodes" / f"{m}.pub").exists()]
    if taken:
        raise UsageError(f"{out} already has keys for {', '.join(taken)}; choose other --machine names (keys are "
                         "never overwritten: the machine holding them would be locked out)")
    if not (out / "ca.key").exists():
        ca_key = ec.generate_private_key(ec.SECP384R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hitoban federated run CA")])
        ca = _certificate("hitoban federated run CA", ca_key, ca_name, ca_key, days, ca=True)
        server_key = ec.generate_private_key(ec.SECP384R1())
        server = _certificate(hosts[0], server_key, ca_name, ca_key, days, ca=False, hosts=hosts)
        _write(out / "ca.crt", ca.public_bytes(serialization.Encoding.PEM))
        _write(out / "ca.key", _pem_key(ca_key), private=True)
        _write(out / "server.crt", server.public_bytes(serialization.Encoding.PEM))
        _write(out / "server.key", _pem_key(server_key), private=True)
    for name in machines:
        key = ec.generate_private_key(ec.SECP384R1())
        _write(out / f"node-{name}" / "node.key", key.private_bytes(serialization.Encoding.PEM,
                                                                    serialization.PrivateFormat.OpenSSH,
                                                                    serialization.NoEncryption()), private=True)
        shutil.copy2(out / "ca.crt", out / f"node-{name}" / "ca.crt")
        _write(out / "nodes" / f"{name}.pub", key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                                            serialization.PublicFormat.OpenSSH))
    return {"out": str(out), "machines": machines, "hosts": hosts,
            "server": {"certificate": str(out / "server.crt"), "key": str(out / "server.key")},
            "nodes": {name: str(out / f"node-{name}") for name in machines},
            "next": f"copy node-NAME/ to each machine; start the server with --keys {out}"}


def node_keys(keys: Path) -> list[Path]:
    """The public keys `serve --keys` registers."""
    found = sorted((Path(keys) / "nodes").glob("*.pub"))
    if not found:
        raise UsageError(f"{keys}/nodes/ holds no public keys: make them with `hitoban federate keys --out {keys}`")
    return found


# ------------------------------------------------------------------------------ who sent a reply: signed by its key
def reply_payload(run_id: str, task_id: int, machine: str, delta_digest: str) -> bytes:
    """What a machine signs: this run, this task, its name and the sha256 of the delta it sends. A reply cannot be
    moved to another task, another name or another delta without the signature failing."""
    return f"hitoban-reply\0{run_id}\0{int(task_id)}\0{machine}\0{delta_digest}".encode()


def sign(private_key: str | os.PathLike, payload: bytes) -> str:
    """The payload's ECDSA (SHA-256) signature by a machine's node.key (OpenSSH format), hex."""
    key = serialization.load_ssh_private_key(Path(private_key).read_bytes(), password=None)
    return key.sign(payload, ec.ECDSA(hashes.SHA256())).hex()


def registered_keys(keys: str | os.PathLike) -> dict[str, ec.EllipticCurvePublicKey]:
    """name -> public key, for every machine `serve --keys` registers (KEYS/nodes/NAME.pub)."""
    return {path.stem: serialization.load_ssh_public_key(path.read_bytes()) for path in node_keys(Path(keys))}


def signed_by(public_key, payload: bytes, signature: str) -> bool:
    from cryptography.exceptions import InvalidSignature

    try:
        public_key.verify(bytes.fromhex(signature), payload, ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True
