"""`hitoban federate keys`: what Flower's authentication reads, never overwritten; and the refusals before any
process starts."""

from __future__ import annotations

import time

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_ssh_private_key, load_ssh_public_key

from hitoban.errors import UsageError
from hitoban.training.federated.keys import make_keys


def test_keys_are_what_flower_reads_and_machines_can_be_added_without_touching_the_ca(tmp_path):
    make_keys(tmp_path, ["a"], ["localhost", "127.0.0.1"])
    public = load_ssh_public_key((tmp_path / "nodes" / "a.pub").read_bytes())
    private = load_ssh_private_key((tmp_path / "node-a" / "node.key").read_bytes(), password=None)
    assert isinstance(public, ec.EllipticCurvePublicKey) and public.curve.name == "secp384r1"  # Flower: NIST EC
    assert private.public_key().public_numbers() == public.public_numbers()
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    server = x509.load_pem_x509_certificate((tmp_path / "server.crt").read_bytes())
    server.verify_directly_issued_by(ca)
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    assert (tmp_path / "node-a" / "ca.crt").read_bytes() == (tmp_path / "ca.crt").read_bytes()
    assert (tmp_path / "server.key").stat().st_mode & 0o077 == 0  # private keys: owner only

    before = (tmp_path / "ca.crt").read_bytes()
    make_keys(tmp_path, ["b"], ["localhost"])
    assert (tmp_path / "ca.crt").read_bytes() == before and (tmp_path / "nodes" / "b.pub").exists()
    with pytest.raises(UsageError, match="already has keys for a"):
        make_keys(tmp_path, ["a"], ["localhost"])
    with pytest.raises(UsageError, match="distinct and plain"):
        make_keys(tmp_path, ["../x"], ["localhost"])


def test_serve_and_join_refuse_to_guess_between_keys_and_insecure(tmp_path):
    pytest.importorskip("flwr", reason="the federated extra: pip install 'hitoban[federated]'")
    from hitoban.training.federated.launch import join, serve
    from hitoban.training.federated.options import JoinOptions, ServeOptions

    with pytest.raises(UsageError, match="--keys KEYS .* or --insecure"):
        serve(ServeOptions(data=str(tmp_path), out=str(tmp_path / "run"), tokens=100))
    with pytest.raises(UsageError, match="--keys node-NAME .* or --insecure"):
        join(JoinOptions(server="127.0.0.1:1", data=str(tmp_path), keys=str(tmp_path), insecure=True))
    with pytest.raises(UsageError, match="no node.key and ca.crt"):
        join(JoinOptions(server="127.0.0.1:1", data=str(tmp_path), keys=str(tmp_path)))


@pytest.mark.slow
def test_a_machine_whose_server_never_answers_leaves_after_wait_minutes(tiny_shards, tmp_path):
    pytest.importorskip("flwr", reason="the federated extra: pip install 'hitoban[federated]'")
    from hitoban.training.federated.launch import FlowerFailed, free_port, join
    from hitoban.training.federated.options import JoinOptions

    started = time.time()
    with pytest.raises(FlowerFailed, match="no server accepted m at 127.0.0.1:"):
        join(JoinOptions(server=f"127.0.0.1:{free_port()}", data=str(tiny_shards), name="m", state=str(tmp_path),
                         insecure=True, wait_minutes=0.04), show=lambda line: None)
    assert time.time() - started < 60  # it left; the SuperNode it started is stopped with it


def test_a_reply_is_signed_by_its_machine_s_key_and_by_no_other(tmp_path):
    """The name a server credits is the key's: a signature verifies only with the signer's registered public key and
    only over the same run, task, name and delta digest (each field changed in turn is the negative control)."""
    from hitoban.training.federated.keys import registered_keys, reply_payload, sign, signed_by

    make_keys(tmp_path / "keys", ["a", "b"], ["localhost"])
    keys = registered_keys(tmp_path / "keys")
    payload = reply_payload("run", 3, "a", "d" * 64)
    signature = sign(tmp_path / "keys" / "node-a" / "node.key", payload)
    assert signed_by(keys["a"], payload, signature)
    assert not signed_by(keys["b"], payload, signature)
    for changed in (reply_payload("other", 3, "a", "d" * 64), reply_payload("run", 4, "a", "d" * 64),
                    reply_payload("run", 3, "b", "d" * 64), reply_payload("run", 3, "a", "e" * 64)):
        assert not signed_by(keys["a"], changed, signature)
    for garbage in ("", "zz", "00" * 10, signature[:-2]):
        assert not signed_by(keys["a"], payload, garbage)
