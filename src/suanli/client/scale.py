"""The SDK's call for resizing running elastic work (`suanli scale`).

A mixin of `suanli.client.Client` (kept apart so each file stays small).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from suanli.client.models import load
from suanli.client.workloads import Workload


class ScaleCalls:
    if TYPE_CHECKING:  # provided by `Client`

        def _post(self, path: str, body: Any = None, *, auth: bool = True) -> Any: ...

    def scale(self, ref: str, gpus: int) -> Workload:
        """Run elastic work on `gpus` GPUs, within its spec's {min, max} (409 for rigid work or work not running;
        422 outside the range). The next scheduling pass carries it out: its ranks restart on the new GPUs with the
        new world size and `SUANLI_RESTART_REASON=resize`, billed at the new size from then; a grow waits (its
        events say why) until the GPUs are free. It stays at that size until it ends (`Workload.scale_to`)."""
        return load(Workload, self._post(f"/workloads/{quote(ref, safe='@')}/scale", {"gpus": gpus}))
