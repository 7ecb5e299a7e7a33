"""API tokens (stored as SHA-256 hashes only)."""

from __future__ import annotations

from sqlalchemy import Connection, delete, func, select, update

from monitor.db.models import ApiToken, Project
from monitor.domain import TokenInfo
from monitor.store._sql import table_of

api_tokens = table_of(ApiToken)
projects = table_of(Project)


def insert_token(conn: Connection, project_id: int, name: str, token_hash: str, prefix: str) -> int:
    result = conn.execute(
        api_tokens.insert()
        .values(project_id=project_id, name=name, token_hash=token_hash, prefix=prefix)
        .returning(api_tokens.c.id)
    )
    return int(result.scalar_one())


def find_active(conn: Connection, token_hash: str) -> tuple[int, str] | None:
    """(project_id, project name) of an unrevoked token with this hash."""
    row = conn.execute(
        select(projects.c.id, projects.c.name)
        .join(api_tokens, api_tokens.c.project_id == projects.c.id)
        .where(api_tokens.c.token_hash == token_hash, api_tokens.c.revoked_at.is_(None))
    ).one_or_none()
    return None if row is None else (int(row[0]), str(row[1]))


def any_token(conn: Connection) -> bool:
    """Whether a token row exists, revoked or not: what keeps auth on (revoking never opens the API)."""
    return conn.execute(select(api_tokens.c.id).limit(1)).first() is not None


def active_ids(conn: Connection) -> list[int]:
    query = select(api_tokens.c.id).where(api_tokens.c.revoked_at.is_(None)).order_by(api_tokens.c.id)
    return [int(i) for i in conn.scalars(query)]


def count_revoked(conn: Connection) -> int:
    query = select(func.count()).select_from(api_tokens).where(api_tokens.c.revoked_at.is_not(None))
    return int(conn.execute(query).scalar_one())


def delete_revoked(conn: Connection) -> int:
    """Forget revoked tokens (`lldmon auth off`); returns how many rows went."""
    return int(conn.execute(delete(api_tokens).where(api_tokens.c.revoked_at.is_not(None))).rowcount)


def list_tokens(conn: Connection) -> list[TokenInfo]:
    rows = conn.execute(
        select(api_tokens, projects.c.name.label("project_name"))
        .join(projects, projects.c.id == api_tokens.c.project_id)
        .order_by(api_tokens.c.id)
    ).all()
    return [TokenInfo(r.id, r.project_name, r.name, r.prefix, r.created_at, r.revoked_at) for r in rows]


def revoke(conn: Connection, token_id: int) -> bool:
    result = conn.execute(
        update(api_tokens)
        .where(api_tokens.c.id == token_id, api_tokens.c.revoked_at.is_(None))
        .values(revoked_at=func.now())
    )
    return bool(result.rowcount)
