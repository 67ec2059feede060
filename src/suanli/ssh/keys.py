"""Tenants' SSH public keys, checked at the edge: one OpenSSH line of an allowed algorithm and size.

Parsing is asyncssh's; this module only decides what is allowed and says why not in words naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_KEY_CHARS = 8192  # an RSA-16384 key is ~2,800 characters in OpenSSH form
MIN_RSA_BITS = 2048
MAX_RSA_BITS = 16384  # bigger keys only make every signature check slower
ALLOWED = {
    b"ssh-ed25519": "ed25519",
    b"ecdsa-sha2-nistp256": "ecdsa",
    b"ecdsa-sha2-nistp384": "ecdsa",
    b"ecdsa-sha2-nistp521": "ecdsa",
    b"ssh-rsa": "rsa",
}


class BadKey(ValueError):
    """The text is not an allowed public key; the message names the field."""


@dataclass(frozen=True)
class PublicKey:
    algorithm: str  # the SSH name: ssh-ed25519, ecdsa-sha2-nistp256, ssh-rsa
    openssh: str  # "ALGORITHM BASE64", without the comment
    fingerprint: str  # "SHA256:…", as `ssh-keygen -l` prints it
    comment: str


def parse(text: str, field: str = "public_key") -> PublicKey:
    """One public key in OpenSSH form (the content of `id_ed25519.pub`), or BadKey saying what is wrong."""
    import asyncssh

    if len(text) > MAX_KEY_CHARS:
        raise BadKey(f"{field}: at most {MAX_KEY_CHARS} characters (one public key)")
    if "PRIVATE KEY" in text:
        raise BadKey(f"{field}: this is a private key; give the public one (the .pub file) and keep this secret")
    lines = [ln for ln in text.strip().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if len(lines) != 1:
        raise BadKey(f"{field}: expected one public key on one line (the content of ~/.ssh/id_ed25519.pub)")
    try:
        key = asyncssh.import_public_key(lines[0].strip())
    except (asyncssh.KeyImportError, ValueError, TypeError) as e:
        raise BadKey(f"{field}: not an OpenSSH public key ({e})") from None
    kind = ALLOWED.get(key.algorithm)
    if kind is None:
        allowed = ", ".join(k.decode() for k in ALLOWED)
        raise BadKey(f"{field}: {key.algorithm.decode(errors='replace')} keys are not accepted; use one of {allowed}")
    if kind == "rsa":
        bits = int(getattr(key.pyca_key, "key_size", 0))
        if not MIN_RSA_BITS <= bits <= MAX_RSA_BITS:
            raise BadKey(f"{field}: RSA keys need {MIN_RSA_BITS} to {MAX_RSA_BITS} bits (this one has {bits}); "
                            "ed25519 is better: ssh-keygen -t ed25519")  # fmt: skip
    openssh = key.export_public_key("openssh").decode("ascii").split()[:2]
    comment = key.get_comment() or ""
    return PublicKey(key.algorithm.decode(), " ".join(openssh), key.get_fingerprint("sha256"), comment[:128])


def fingerprint_of(key: object) -> str:
    """The SHA256 fingerprint of an asyncssh key (what the server is offered at login)."""
    return str(key.get_fingerprint("sha256"))  # type: ignore[attr-defined]
