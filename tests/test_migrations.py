"""The Alembic migrations build exactly the schema the models describe, on both databases, and re-run safely."""

from __future__ import annotations

import subprocess
import sys
import time

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from suanli.db.columns import Money
from suanli.db.engine import Database
from suanli.db.migrate import migrate
from suanli.db.models import Base


def _compare_type(ctx: object, inspected: object, metadata: object, reflected: object, model: object) -> bool | None:
    """Alembic's own type comparison, except money on SQLite: an INTEGER of 1e-8 units kept in the NUMERIC column
    0001 made (0012 converted the values; the declared type stays, so no table is copied)."""
    if getattr(model, "__class__", None) is Money and conn_dialect(ctx) == "sqlite":
        return False
    return None


def conn_dialect(ctx: object) -> str:
    return str(ctx.dialect.name)  # type: ignore[attr-defined]


def test_migrations_match_the_models(empty_db_url: str) -> None:
    db = Database(empty_db_url)
    try:
        migrate(db.engine)
        migrate(db.engine)  # every server start runs this: a second run is a no-op
        with db.engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": False})
            diff = compare_metadata(ctx, Base.metadata)
            assert diff == [], f"models and migrations differ: {diff}"
            assert ctx.get_current_revision() is not None
        assert set(Base.metadata.tables) <= set(inspect(db.engine).get_table_names())
    finally:
        db.dispose()


def test_processes_starting_together_migrate_once(empty_db_url: str) -> None:
    """`suanli server --workers N` starts N processes that all migrate on start, at the same moment."""
    code = (
        "import sys, time; from suanli.db.engine import Database; from suanli.db.migrate import migrate\n"
        "db = Database(sys.argv[1]); t = float(sys.argv[2])\n"
        "time.sleep(max(0.0, t - time.time())); migrate(db.engine); print('ok')"
    )
    start = time.time() + 2.0
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, empty_db_url, str(start)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=60) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0 and out.strip() == b"ok", err.decode()[-2000:]
    db = Database(empty_db_url)
    try:
        with db.engine.connect() as conn:
            assert MigrationContext.configure(conn).get_current_revision() is not None
            ctx = MigrationContext.configure(conn, opts={"compare_type": _compare_type})
            assert compare_metadata(ctx, Base.metadata) == []
    finally:
        db.dispose()


def test_adding_submitted_at_keeps_every_workload_and_its_events(empty_db_url: str) -> None:
    """0006 upgrades a database with work in it: each workload's place is its `queued_at`, and no event is lost
    (a table copy on SQLite would have deleted them through the events' ON DELETE CASCADE). Down and up again
    keeps them too."""
    from alembic import command
    from sqlalchemy import text

    from suanli.db.migrate import alembic_config

    db = Database(empty_db_url)
    try:
        migrate(db.engine, "0005")
        with db.engine.begin() as c:
            c.execute(text("INSERT INTO orgs (id, name, personal, created_at) VALUES ('o', 'o', true, :t)"),
                      {"t": "2026-01-01 00:00:00"})  # fmt: skip
            c.execute(text("INSERT INTO users (id, email, password_hash, is_admin, personal_org_id, created_at) "
                           "VALUES ('u', 'u@example.com', 'x', false, 'o', :t)"), {"t": "2026-01-01 00:00:00"})  # fmt: skip
            for wid, kind in (("w", "job"), ("i", "instance")):
                c.execute(
                    text("INSERT INTO workloads (id, org_id, user_id, name, kind, spec, state, reason, pending_reason, "
                         "attempt, retries, executor, attained_gpu_s, has_workdir, created_at, queued_at) VALUES "
                         "(:w, 'o', 'u', :w, :k, '{}', 'pending', '', '', 1, 1, '', 0, false, :c, :q)"),
                    {"w": wid, "k": kind, "c": "2026-01-01 00:00:00", "q": "2026-01-02 03:04:05"},
                )  # fmt: skip
            c.execute(text("INSERT INTO workload_events (workload_id, at, state, reason) VALUES "
                           "('w', :t, 'pending', 'submitted'), ('w', :t, 'pending', 'retry 1/1')"),
                      {"t": "2026-01-01 00:00:00"})  # fmt: skip
        migrate(db.engine)

        def rows() -> tuple[dict[str, tuple[str, str, str]], int]:
            with db.engine.connect() as c:
                times = c.execute(text("SELECT id, submitted_at, created_at, queued_at FROM workloads")).all()
                events = c.execute(text("SELECT count(*) FROM workload_events")).scalar_one()
                return {w: (str(s), str(cr), str(q)) for w, s, cr, q in times}, events

        times, events = rows()
        assert events == 2
        assert times["w"][0] == times["w"][1]  # a job was submitted when it was created (retries since kept it)
        assert times["i"][0] == times["i"][2]  # an instance may have been started again: its queued_at
        command.downgrade(alembic_config(db.engine), "0005")
        with db.engine.connect() as c:
            assert c.execute(text("SELECT count(*) FROM workload_events")).scalar_one() == 2
        migrate(db.engine)
        assert rows()[1] == 2
    finally:
        db.dispose()


def test_trial_mailboxes_are_filled_from_the_trials_granted_before(empty_db_url: str) -> None:
    """0025 records the mailbox of every user granted a trial so far, the earliest of each mailbox, so that an
    alias of an address that had its trial before the upgrade gets none after it."""
    from sqlalchemy import text

    from suanli.control.accounts import trials

    db = Database(empty_db_url)
    try:
        migrate(db.engine, "0024")
        people = (("u1", "me+a@gmail.com", "2026-01-02"), ("u2", "m.e@gmail.com", "2026-01-01"),
                  ("u3", "you@example.com", "2026-01-03"), ("u4", "nobody@example.com", None))  # fmt: skip
        with db.engine.begin() as c:
            for uid, email, granted in people:
                c.execute(text("INSERT INTO orgs (id, name, personal, created_at) VALUES (:o, :o, true, :t)"),
                          {"o": f"o{uid}", "t": "2026-01-01 00:00:00"})  # fmt: skip
                c.execute(text("INSERT INTO users (id, email, password_hash, is_admin, personal_org_id, created_at) "
                               "VALUES (:u, :e, 'x', false, :o, :t)"),
                          {"u": uid, "e": email, "o": f"o{uid}", "t": "2026-01-01 00:00:00"})  # fmt: skip
                if granted:
                    c.execute(text("INSERT INTO ledger_transactions (key, kind, memo, org_id, user_id, created_at) "
                                   "VALUES (:k, 'trial_credit', 'trial credit', :o, :u, :t)"),
                              {"k": f"trial:{uid}", "o": f"o{uid}", "u": uid, "t": f"{granted} 00:00:00"})  # fmt: skip
        migrate(db.engine)
        with db.engine.connect() as c:
            got = dict(c.execute(text("SELECT mailbox_hash, user_id FROM trial_mailboxes")).all())
        assert got == {trials.mailbox_key("me@gmail.com"): "u2", trials.mailbox_key("you@example.com"): "u3"}
    finally:
        db.dispose()


def test_orgs_keep_the_sandbox_uid_their_id_gave_and_twins_are_parted(empty_db_url: str) -> None:
    """0028 records each org's sandbox uid: the one its id hashed to before (its files are owned by it), except the
    newer of two orgs that hashed alike, which gets a free one (its next launch hands its trees to it)."""
    import zlib

    from sqlalchemy import text

    from suanli.sandbox.bwrap import SANDBOX_UID_BASE, SANDBOX_UID_SPAN

    def legacy(org_id: str) -> int:
        return SANDBOX_UID_BASE + zlib.crc32(org_id.encode()) % SANDBOX_UID_SPAN

    # The twins hash alike; org_0000000000b97796 (newer, no twin) hashes to the twins' uid + 1, the first free one
    # after theirs: it keeps it, its files are owned by it.
    orgs = (("org_00000000000b1000", "2026-01-02 00:00:00"), ("org_000000000008f18c", "2026-01-01 00:00:00"),
            ("org_lonely", "2026-01-03 00:00:00"), ("org_0000000000b97796", "2026-01-04 00:00:00"))  # fmt: skip
    db = Database(empty_db_url)
    try:
        migrate(db.engine, "0027")
        with db.engine.begin() as c:
            for org_id, made in orgs:
                c.execute(text("INSERT INTO orgs (id, name, personal, created_at) VALUES (:o, :o, true, :t)"),
                          {"o": org_id, "t": made})  # fmt: skip
        migrate(db.engine)
        with db.engine.connect() as c:
            got = dict(c.execute(text("SELECT id, sandbox_uid FROM orgs")).all())
        assert legacy("org_00000000000b1000") == legacy("org_000000000008f18c")
        assert got["org_000000000008f18c"] == legacy("org_000000000008f18c")  # the older twin keeps it
        assert got["org_lonely"] == legacy("org_lonely")
        assert legacy("org_0000000000b97796") == legacy("org_000000000008f18c") + 1
        assert got["org_0000000000b97796"] == legacy("org_0000000000b97796")
        newer = got["org_00000000000b1000"]
        assert newer not in {legacy(o) for o, _ in orgs}  # no org's own: not the twin's, not the third's
        assert SANDBOX_UID_BASE <= newer < SANDBOX_UID_BASE + SANDBOX_UID_SPAN
    finally:
        db.dispose()
