"""Key material of the parameter server: reading an HMAC shared secret, loading a client's CURVE
keys, and ``cosparse ps keygen`` (CURVE key pairs and a random HMAC secret). Used by the server
and the client alike."""

from __future__ import annotations

import os
from pathlib import Path

import zmq


def read_key_file(path: str | Path) -> bytes:
    """A shared HMAC secret from a file (whitespace stripped; at least 16 bytes)."""
    key = Path(path).read_bytes().strip()
    if len(key) < 16:
        raise ValueError(f"{path}: an HMAC key needs at least 16 bytes")
    return key


def client_curve_keys(curve: tuple[str | Path, str | Path]) -> tuple[bytes, bytes, bytes]:
    """(public, secret, server public) keys of a client from (its secret key file, the server's
    public key file), as ``cosparse ps keygen`` writes them."""
    from zmq.auth import load_certificate

    pub, sec = load_certificate(str(curve[0]))
    server_pub, _ = load_certificate(str(curve[1]))
    return pub, sec, server_pub


def keygen(out_dir: str | Path) -> dict[str, str]:
    """CURVE keys: ``server.key_secret`` (+ ``server.key``) and ``clients/client.key_secret``.

    The server loads ``--curve-secret DIR/server.key_secret`` and admits the client public keys
    in ``DIR/clients``; a client needs ``DIR/clients/client.key_secret`` and ``DIR/server.key``.
    Also writes ``hmac.key``, a random shared secret for ``--auth-key``.
    """
    from zmq.auth import create_certificates

    if not zmq.has("curve"):
        raise RuntimeError("this libzmq has no CURVE support")
    out = Path(out_dir)
    (out / "clients").mkdir(parents=True, exist_ok=True)
    server_pub, server_sec = create_certificates(out, "server")
    client_pub, client_sec = create_certificates(out / "clients", "client")
    hmac_path = out / "hmac.key"
    fd = os.open(hmac_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(os.urandom(32).hex().encode())
    for p in (server_sec, client_sec):
        os.chmod(p, 0o600)
    return {"server_public": str(server_pub), "server_secret": str(server_sec),
            "client_public": str(client_pub), "client_secret": str(client_sec),
            "hmac_key": str(hmac_path)}
