"""endpoints: models served as OpenAI-compatible endpoints (their replicas are workloads), endpoint API keys,
events, the gateway's load reports and token usage per key per minute

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-03 12:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0018"
down_revision: str | Sequence[str] | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema: new tables only (no batch copy of any table: see 0006)."""
    op.create_table(
        "endpoints",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("org_id", sa.String(length=32), nullable=False),
        sa.Column("user_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("repo_id", sa.String(length=200), nullable=False),
        sa.Column("min_replicas", sa.Integer(), nullable=False),
        sa.Column("max_replicas", sa.Integer(), nullable=False),
        sa.Column("desired", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("changed_at", sa.DateTime(), nullable=True),
        sa.Column("busy_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(["org_id"], ["orgs.id"], name=op.f("fk_endpoints_org_id_orgs")),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name=op.f("fk_endpoints_user_id_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_endpoints")),
        sa.UniqueConstraint("org_id", "name", name="uq_endpoints_org_id_name"),
    )
    op.create_table(
        "endpoint_replicas",
        sa.Column("workload_id", sa.String(length=32), nullable=False),
        sa.Column("endpoint_id", sa.String(length=32), nullable=False),
        sa.Column("port", sa.Integer(), nullable=False),
        sa.Column("address", sa.String(length=64), nullable=False),
        sa.Column("ready_attempt", sa.Integer(), nullable=True),
        sa.Column("ready_at", sa.DateTime(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["workload_id"],
            ["workloads.id"],
            name=op.f("fk_endpoint_replicas_workload_id_workloads"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("workload_id", name=op.f("pk_endpoint_replicas")),
    )
    op.create_index(op.f("ix_endpoint_replicas_endpoint_id"), "endpoint_replicas", ["endpoint_id"])
    op.create_table(
        "endpoint_keys",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("endpoint_id", sa.String(length=32), nullable=False),
        sa.Column("org_id", sa.String(length=32), nullable=False),
        sa.Column("user_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("revoked_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(["org_id"], ["orgs.id"], name=op.f("fk_endpoint_keys_org_id_orgs")),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name=op.f("fk_endpoint_keys_user_id_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_endpoint_keys")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_endpoint_keys_token_hash")),
    )
    op.create_index(op.f("ix_endpoint_keys_endpoint_id"), "endpoint_keys", ["endpoint_id"])
    op.create_table(
        "endpoint_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("endpoint_id", sa.String(length=32), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_endpoint_events")),
    )
    op.create_index(op.f("ix_endpoint_events_endpoint_id"), "endpoint_events", ["endpoint_id"])
    op.create_table(
        "endpoint_load",
        sa.Column("endpoint_id", sa.String(length=32), nullable=False),
        sa.Column("worker", sa.String(length=128), nullable=False),
        sa.Column("inflight", sa.Integer(), nullable=False),
        sa.Column("waiting", sa.Integer(), nullable=False),
        sa.Column("last_request_at", sa.DateTime(), nullable=True),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("endpoint_id", "worker", name=op.f("pk_endpoint_load")),
    )
    op.create_table(
        "endpoint_usage",
        sa.Column("endpoint_id", sa.String(length=32), nullable=False),
        sa.Column("key_id", sa.String(length=32), nullable=False),
        sa.Column("minute", sa.DateTime(), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.Column("charged_tokens", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("endpoint_id", "key_id", "minute", name=op.f("pk_endpoint_usage")),
    )
    op.create_index("ix_endpoint_usage_endpoint_minute", "endpoint_usage", ["endpoint_id", "minute"])


def downgrade() -> None:
    """Downgrade schema (plain DROP INDEX and DROP TABLE)."""
    op.drop_index("ix_endpoint_usage_endpoint_minute", table_name="endpoint_usage")
    op.drop_table("endpoint_usage")
    op.drop_table("endpoint_load")
    op.drop_index(op.f("ix_endpoint_events_endpoint_id"), table_name="endpoint_events")
    op.drop_table("endpoint_events")
    op.drop_index(op.f("ix_endpoint_keys_endpoint_id"), table_name="endpoint_keys")
    op.drop_table("endpoint_keys")
    op.drop_index(op.f("ix_endpoint_replicas_endpoint_id"), table_name="endpoint_replicas")
    op.drop_table("endpoint_replicas")
    op.drop_table("endpoints")
