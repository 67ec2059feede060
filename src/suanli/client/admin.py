"""The SDK's operator calls: users and orgs, money moved by hand, quotas, the price book, clusters and nodes.

A mixin of `suanli.client.Client` (kept apart so each file stays small); every call needs an admin login.
"""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING, Any

from suanli.client.models import Cluster, LedgerCheck, Node, Org, Transaction, User, load
from suanli.client.requests import UNCHANGED, Unchanged, _amount, _params, _seg

if TYPE_CHECKING:
    import httpx


class AdminCalls:
    if TYPE_CHECKING:  # provided by `Client`

        def _get(self, path: str, **params: Any) -> Any: ...
        def _post(self, path: str, body: Any = None, *, auth: bool = True) -> Any: ...
        def call(
            self,
            method: str,
            path: str,
            body: Any = None,
            *,
            params: dict[str, Any] | None = None,
            auth: bool = True,
            headers: dict[str, str] | None = None,
        ) -> Any: ...
        def request(
            self,
            method: str,
            path: str,
            *,
            json: Any = None,
            params: dict[str, Any] | None = None,
            auth: bool = True,
            headers: dict[str, str] | None = None,
        ) -> httpx.Response: ...

    # ---- operators: users and orgs ----
    def admin_users(self, limit: int | None = None) -> list[User]:
        return [load(User, u) for u in self._get("/admin/users", limit=limit)]

    def admin_create_user(self, email: str, password: str, *, admin: bool = False, trial_credit: bool = False) -> User:
        body = {"email": email, "password": password, "admin": admin, "trial_credit": trial_credit}
        return load(User, self._post("/admin/users", body))

    def admin_set_admin(self, user_id: str, admin: bool) -> User:
        return load(User, self.call("PATCH", f"/admin/users/{_seg(user_id)}", {"admin": admin}))

    def admin_orgs(self, limit: int | None = None) -> list[Org]:
        return [load(Org, o) for o in self._get("/admin/orgs", limit=limit)]

    def admin_set_quota(
        self, org: str, gpus: int | Unchanged | None = UNCHANGED, *, cpus: int | Unchanged | None = UNCHANGED,
        memory_gib: int | Unchanged | None = UNCHANGED,
    ) -> Org:  # fmt: skip
        """`org` is an id or a name. Sets the quotas given: GPUs, host CPU cores, host memory GiB held at once (None
        removes that limit); the others stay as they are."""
        limits = {k: v for k, v in (("gpus", gpus), ("cpus", cpus), ("memory_gib", memory_gib))
                  if not isinstance(v, Unchanged)}  # fmt: skip
        if not limits:
            raise ValueError("give at least one of gpus, cpus and memory_gib")
        return load(Org, self.call("PUT", f"/admin/orgs/{_seg(org)}/quota", limits))

    def admin_move(
        self, org: str, amount: Decimal | int | str, kind: str = "topup", memo: str = "", key: str | None = None
    ) -> Transaction:
        """Top up, credit or refund an org (id or name); with `key`, a retry posts nothing twice."""
        body = {"amount": _amount(amount), "kind": kind, "memo": memo, "key": key}
        return load(Transaction, self._post(f"/admin/orgs/{_seg(org)}/transactions", body))

    def admin_ledger_check(self) -> LedgerCheck:
        return load(LedgerCheck, self._get("/admin/ledger/check"))

    # ---- operators: prices ----
    def admin_set_prices(self, book: dict[str, Any], if_version: int | None = None) -> dict[str, Any]:
        """Replace the whole price book (the document `prices()` returns). With `if_version` (e.g. the `version` of
        the book this one was made from), only while that version is in force: else an ApiError 412, and the edit
        another operator made since stands."""
        headers = None if if_version is None else {"If-Match": f'"{int(if_version)}"'}
        return self.call("PUT", "/admin/prices", book, headers=headers)

    def admin_set_plan(self, name: str, hours: int, discount: Decimal | int | str) -> dict[str, Any]:
        """Add or change one plan (hours, discount as a share: "0.10" is 10% off); a new book version."""
        return self.call("PUT", f"/admin/prices/plans/{_seg(name)}", {"hours": hours, "discount": _amount(discount)})

    def admin_retire_plan(self, name: str) -> dict[str, Any]:
        """Stop selling a plan (plans bought keep their terms); a new book version."""
        return self.call("DELETE", f"/admin/prices/plans/{_seg(name)}")

    def admin_set_host_prices(
        self, cpu_core_hour: Decimal | int | str | None = None, memory_gib_hour: Decimal | int | str | None = None
    ) -> dict[str, Any]:
        """Set the price of host CPU per core-hour and/or memory per GiB-hour (None: keep it); a new book version."""
        body = _params(cpu_core_hour=None if cpu_core_hour is None else _amount(cpu_core_hour),
                       memory_gib_hour=None if memory_gib_hour is None else _amount(memory_gib_hour))  # fmt: skip
        return self.call("PUT", "/admin/prices/host", body)

    def admin_set_usage_prices(
        self, gpu_hour: dict[str, Decimal | int | str | None] | None = None, floor: Decimal | int | str | None = None
    ) -> dict[str, Any]:
        """Set usage prices per GPU-hour fully active (a model mapped to None is no longer offered by usage) and/or
        the floor (the share of it an idle GPU-hour costs); a new book version."""
        body = _params(gpu_hour={k: None if v is None else _amount(v) for k, v in (gpu_hour or {}).items()} or None,
                       floor=None if floor is None else _amount(floor))  # fmt: skip
        return self.call("PUT", "/admin/prices/usage", body)

    def admin_set_gpu_price(
        self, gpu: str, price: Decimal | int | str | None = None, remove: bool = False
    ) -> dict[str, Any]:
        """Set one GPU model's on-demand price per GPU-hour, or stop offering it (`remove`)."""
        body = {"on_demand": None if price is None else _amount(price), "remove": remove}
        return self.call("PUT", f"/admin/prices/gpus/{_seg(gpu)}", body)

    # ---- operators: clusters and nodes ----
    def admin_clusters(self) -> list[Cluster]:
        return [load(Cluster, c) for c in self._get("/admin/clusters")]

    def admin_register_cluster(
        self,
        *,
        preset: str | None = None,
        spec: dict[str, Any] | None = None,
        local: bool = False,
        name: str | None = None,
    ) -> Cluster:
        """Register a topology preset or a cluster spec (virtual nodes), or the server's own host (`local`)."""
        body = _params(preset=preset, spec=spec, name=name) | ({"local": True} if local else {})
        return load(Cluster, self._post("/admin/clusters", body))

    def admin_remove_cluster(self, name: str) -> None:
        self.request("DELETE", f"/admin/clusters/{_seg(name)}")

    def admin_nodes(
        self,
        *,
        state: str | None = None,
        cluster: str | None = None,
        limit: int | None = None,
        offset: int | None = None,
    ) -> list[Node]:
        rows = self._get("/admin/nodes", state=state, cluster=cluster, limit=limit, offset=offset)
        return [load(Node, n) for n in rows]

    def admin_node(self, name: str) -> Node:
        """One node (by name or id) with its GPUs."""
        return load(Node, self._get(f"/admin/nodes/{_seg(name)}"))

    def admin_set_node_state(self, name: str, state: str, reason: str = "") -> Node:
        """`draining` (running work finishes, nothing new lands), `down`, or `ready` again."""
        body = {"state": state, "reason": reason}
        return load(Node, self.call("PATCH", f"/admin/nodes/{_seg(name)}", body))
