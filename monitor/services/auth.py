"""Bearer tokens: minted once, stored hashed, scoped to one project.

Auth is on as soon as one unrevoked token exists; with none, the local quickstart is open.
Tokens are 256-bit random strings, so a plain SHA-256 suffices (no slow KDF needed).
"""

from __future__ import annotations

import hashlib
import secrets

from monitor.domain import Principal, RunInfo, TokenInfo
from monitor.errors import Forbidden, NotFound, Unauthorized
from monitor.store import Database
from monitor.store import runs as run_store
from monitor.store import tokens as token_store

TOKEN_PREFIX = "lldm_"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class AuthService:
    def __init__(self, db: Database) -> None:
        self.db = db

    def create_token(self, project: str, name: str = "") -> tuple[str, int]:
        """Mint a token for `project` (created if needed). The plaintext is returned only here."""
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        with self.db.write() as conn:
            project_id = run_store.get_or_create_project(conn, project)
            token_id = token_store.insert_token(
                conn, project_id, name, hash_token(token), token[: len(TOKEN_PREFIX) + 4]
            )
        return token, token_id

    def list_tokens(self) -> list[TokenInfo]:
        with self.db.read() as conn:
            return token_store.list_tokens(conn)

    def revoke(self, token_id: int) -> None:
        with self.db.write() as conn:
            if not token_store.revoke(conn, token_id):
                raise NotFound(f"no active token with id {token_id}")

    def authenticate(self, authorization: str | None) -> Principal:
        """Principal for an `Authorization` header value (None if absent)."""
        with self.db.read() as conn:
            if authorization is None:
                if token_store.any_active(conn):
                    raise Unauthorized("this server requires 'Authorization: Bearer <token>'")
                return Principal()
            scheme, _, token = authorization.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise Unauthorized("expected 'Authorization: Bearer <token>'")
            found = token_store.find_active(conn, hash_token(token.strip()))
        if found is None:
            raise Unauthorized("unknown or revoked token")
        return Principal(project_id=found[0], project=found[1])


def check_access(principal: Principal, run: RunInfo) -> None:
    if not principal.unrestricted and principal.project_id != run.project_id:
        raise Forbidden(f"this token belongs to project {principal.project!r}, not {run.project!r}")
