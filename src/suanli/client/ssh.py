"""The SDK's calls for getting into instances: SSH public keys, where the server's SSH gateway listens, and
single-use browser links into an instance's JupyterLab or a workload's ports.

A mixin of `suanli.client.Client` (kept apart so each file stays small). With a key added, `ssh -p PORT
INSTANCE@HOST` enters any running instance of the orgs the user is a member of.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from suanli.client.models import ProxyLink, SshInfo, SshKey, load

if TYPE_CHECKING:
    import httpx


class SshCalls:
    if TYPE_CHECKING:  # provided by `Client`
        server: str

        def call(
            self, method: str, path: str, body: Any = None, *, params: dict[str, Any] | None = None, auth: bool = True
        ) -> Any: ...
        def _get(self, path: str, **params: Any) -> Any: ...
        def _post(self, path: str, body: Any = None, *, auth: bool = True) -> Any: ...
        def request(self, method: str, path: str, **kw: Any) -> httpx.Response: ...

    def ssh_keys(self) -> list[SshKey]:
        """Your SSH public keys."""
        return [load(SshKey, k) for k in self._get("/keys")]

    def ssh_key_add(self, public_key: str | Path, name: str | None = None, password: str | None = None) -> SshKey:
        """Add a public key: its OpenSSH text, or the path of a `.pub` file. `name` defaults to its comment. A key
        never expires: a client whose token does gives the account's `password` (refused without it: 403)."""
        text = public_key.read_text(encoding="utf-8") if isinstance(public_key, Path) else public_key
        body: dict[str, str | None] = {"public_key": text, "name": name}
        if password is not None:
            body["password"] = password
        return load(SshKey, self._post("/keys", body))

    def ssh_key_remove(self, key: str) -> SshKey:
        """Remove one of your keys, by id or by fingerprint (`SHA256:…`, which may hold a '/': found by listing)."""
        if key.startswith("SHA256:"):
            key = next((k.id for k in self.ssh_keys() if k.fingerprint == key), key)
        return load(SshKey, self.call("DELETE", f"/keys/{quote(key, safe='')}"))

    def ssh_info(self) -> SshInfo:
        """The SSH gateway's port and host key (`enabled` False when the server runs none)."""
        return load(SshInfo, self._get("/ssh"))

    def open_link(self, ref: str, port: int | None = None) -> ProxyLink:
        """A link (single use, a minute) into a running workload: its JupyterLab (instances; started now if it was
        not started with `jupyter: true`), or one of its `ports`. Opening it in a browser signs that browser in to
        that instance only; the API token never goes into the URL."""
        raw = self._post(f"/workloads/{quote(ref, safe='')}/proxy", {"port": port} if port is not None else None)
        link = load(ProxyLink, raw)
        url = link.url if link.url.startswith(("http://", "https://")) else self.server.rstrip("/") + link.url
        return ProxyLink(url, link.expires_at, link.target, link.started_jupyter)
