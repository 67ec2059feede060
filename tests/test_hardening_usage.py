"""Issue: `usage --workload NAME` printed nothing where the id worked. A workload is found by its name as well
as its id (every run of that name), within the org only. In-process on both databases."""

from __future__ import annotations

from fastapi.testclient import TestClient

from suanli.client import Client
from tests.control_plane import InProcess, signup
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


def test_usage_is_paged_newest_first_and_a_foreign_cursor_is_refused(api: TestClient) -> None:
    """Issue: the usage statement stopped silently at 10,000 rows, the older ones out of reach. It is paged: `limit`
    rows, newest first, and `X-Next-After` names the cursor of the next page (absent on the last)."""
    c = make_cluster(api)
    ids = [c.submit(rigid(f"job-{i}", 1, 5), t=i) for i in range(5)]
    c.tick(6)
    c.tick(20)
    url = f"{API}/orgs/{c.tenant.org_id}/usage"
    whole = api.get(url, headers=c.tenant.headers).json()
    assert {r["workload"] for r in whole} == set(ids) and len(whole) == 5
    pages, after = [], None
    while True:
        params = {"limit": 2, **({"after": after} if after else {})}
        r = api.get(url, params=params, headers=c.tenant.headers)
        assert r.status_code == 200, r.text
        pages.append(r.json())
        after = r.headers.get("X-Next-After")
        if after is None:
            break
        assert after == r.json()[-1]["allocation"]
    assert [len(p) for p in pages] == [2, 2, 1]
    assert [row for p in pages for row in p] == whole, "the pages are the whole statement, in its order"
    starts = [row["started_at"] for row in whole]
    assert starts == sorted(starts, reverse=True)
    csv_page = api.get(url, params={"limit": 2, "format": "csv"}, headers=c.tenant.headers)
    assert csv_page.headers["X-Next-After"] == pages[0][-1]["allocation"] and csv_page.text.count("\n") == 3
    other = signup(api, "other@example.com")
    r = api.get(f"{API}/orgs/{other.org_id}/usage", params={"after": whole[0]["allocation"]}, headers=other.headers)
    assert r.status_code == 422 and "after" in r.json()["detail"], r.text
    for bad in ("x" * 65, "' OR 1=1 --", "../al_x", "%00"):  # malformed cursors: a 422 naming after, never a 500
        r = api.get(url, params={"after": bad}, headers=c.tenant.headers)
        assert r.status_code == 422 and "after" in r.text, (bad, r.text)
    sdk = Client("http://testserver", token=c.tenant.token, transport=InProcess(api))
    assert sdk.usage(page_size=2) == whole, "the SDK follows the pages to the last"
    assert sdk.usage_csv(page_size=2) == api.get(url, params={"format": "csv"}, headers=c.tenant.headers).text
    assert api.get(url, params={"limit": 0}, headers=c.tenant.headers).status_code == 422
    assert api.get(url, params={"limit": 10_001}, headers=c.tenant.headers).status_code == 422
