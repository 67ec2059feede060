"""Issue: `usage --workload NAME` printed nothing where the id worked. A workload is found by its name as well
as its id (every run of that name), within the org only. In-process on both databases."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.control_plane import signup
from tests.test_resize_virtual import API, make_cluster, rigid


def test_usage_by_workload_name_or_id_and_never_another_orgs(api: TestClient) -> None:
    c = make_cluster(api)
    other = signup(api, "other@example.com")
    api.post(f"{API}/admin/orgs/{other.org_id}/transactions", headers=c.admin,
             json={"kind": "topup", "amount": "1000"})  # fmt: skip
    first = c.submit(rigid("nightly", 1, 5), t=0)
    second = c.submit(rigid("nightly", 1, 5), t=0)
    c.submit(rigid("other-job", 1, 5), t=0)
    theirs = c.submit(rigid("nightly", 1, 5), t=0, who=other)
    c.tick(1)
    c.tick(10)

    def rows(ref: str) -> set[str]:
        r = api.get(f"{API}/orgs/{c.tenant.org_id}/usage", params={"workload": ref}, headers=c.tenant.headers)
        assert r.status_code == 200, r.text
        return {row["workload"] for row in r.json()}

    assert rows("nightly") == {first, second}  # both runs of that name, not the other org's
    assert rows(first) == {first}
    assert theirs not in rows(theirs)
    assert rows("no-such-job") == set()
