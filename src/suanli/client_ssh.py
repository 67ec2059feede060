"""The SDK's SSH calls: the caller's public keys, and where the server's SSH gateway listens.

A mixin of `suanli.client.Client` (kept apart so each file stays small). With a key added, `ssh -p PORT
INSTANCE@HOST` enters any running instance of the orgs the user is a member of.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from suanli.client_models import SshInfo, SshKey, load

if TYPE_CHECKING:
    import httpx


class SshCalls:
    if TYPE_CHECKING:  # provided by `Client`

        def call(
            self, method: str, path: str, body: Any = None, *, params: dict[str, Any] | None = None, auth: bool = True
        ) -> Any: ...
        def _get(self, path: str, **params: Any) -> Any: ...
        def _post(self, path: str, body: Any = None, *, auth: bool = True) -> Any: ...
        def request(self, method: str, path: str, **kw: Any) -> httpx.Response: ...

    def ssh_keys(self) -> list[SshKey]:
        """Your SSH public keys."""
        return [load(SshKey, k) for k in self._get("/keys")]

    def ssh_key_add(self, public_key: str | Path, name: str | None = None) -> SshKey:
        """Add a public key: its OpenSSH text, or the path of a `.pub` file. `name` defaults to its comment."""
        text = public_key.read_text(encoding="utf-8") if isinstance(public_key, Path) else public_key
        return load(SshKey, self._post("/keys", {"public_key": text, "name": name}))

    def ssh_key_remove(self, key: str) -> SshKey:
        """Remove one of your keys, by id or by fingerprint (`SHA256:…`, which may hold a '/': found by listing)."""
        if key.startswith("SHA256:"):
            key = next((k.id for k in self.ssh_keys() if k.fingerprint == key), key)
        return load(SshKey, self.call("DELETE", f"/keys/{quote(key, safe='')}"))

    def ssh_info(self) -> SshInfo:
        """The SSH gateway's port and host key (`enabled` False when the server runs none)."""
        return load(SshInfo, self._get("/ssh"))
