"""Bearer tokens: minted once, stored hashed, scoped to one project.

Auth is on as soon as one token has been created, and stays on when every token is revoked (revoking
the last token must lock the API, not open it); only an explicit `lldmon auth off` (`turn_off`), which
forgets the revoked tokens, opens it again. With no token ever created the local quickstart is open.
Tokens are 256-bit random strings, so a plain SHA-256 suffices (no slow KDF needed).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from monitor.domain import MAX_RUN_ID, Principal, TokenInfo
from monitor.errors import Conflict, NotFound, Unauthorized
from monitor.store import Database
from monitor.store import runs as run_store
from monitor.store import tokens as token_store

TOKEN_PREFIX = "lldm_"

log = logging.getLogger("lldmon.auth")


@dataclass(frozen=True)
class AuthStatus:
    active: int
    revoked: int

    @property
    def enabled(self) -> bool:
        return self.active + self.revoked > 0

    def describe(self) -> str:
        """One line: on or off, and why."""
        if self.active:
            return f"auth is on: {self.active} active token(s), {self.revoked} revoked"
        if self.revoked:
            return (
                f"auth is on: all {self.revoked} token(s) are revoked, so every API request is refused; "
                "create one (`lldmon token create`) or open the API with `lldmon auth off`"
            )
        return "auth is off: no token exists, the API is open to anyone who can reach it"


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

    def status(self) -> AuthStatus:
        with self.db.read() as conn:
            return AuthStatus(len(token_store.active_ids(conn)), token_store.count_revoked(conn))

    def turn_off(self) -> int:
        """Open the API again by forgetting the revoked tokens; returns how many were deleted.

        Refused while a token is active: that token would switch auth straight back on, so the
        caller has to revoke it first, deliberately.
        """
        with self.db.write() as conn:
            active = token_store.active_ids(conn)
            if active:
                ids = ", ".join(map(str, active))
                raise Conflict(
                    f"{len(active)} active token(s) (id {ids}): revoke them first (`lldmon token revoke ID`)",
                    field="tokens",
                )
            deleted = token_store.delete_revoked(conn)
        if deleted:
            log.warning("auth turned off: %d revoked token(s) deleted, the API is open", deleted)
        return deleted

    def authenticate(self, authorization: str | None) -> Principal:
        """Principal for an `Authorization` header value (None if absent)."""
        with self.db.read() as conn:
            if authorization is None:
                if token_store.any_token(conn):
                    raise Unauthorized("this server requires 'Authorization: Bearer <token>'")
                return Principal()
            scheme, _, token = authorization.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise Unauthorized("expected 'Authorization: Bearer <token>'")
            found = token_store.find_active(conn, hash_token(token.strip()))
        if found is None:
            raise Unauthorized("unknown or revoked token")
        return Principal(project_id=found[0], project=found[1])


class OwnedRun(Protocol):
    """What the access check reads of a run (`RunInfo`, or the ingest path's lighter read)."""

    @property
    def id(self) -> int: ...

    @property
    def project_id(self) -> int: ...


def check_access(principal: Principal, run: OwnedRun) -> None:
    """Another project's run answers exactly like a missing one: neither its project nor its existence leaks."""
    if not principal.unrestricted and principal.project_id != run.project_id:
        raise NotFound(f"run {run.id} does not exist")


Owned = TypeVar("Owned", bound=OwnedRun)


def accessible_run(principal: Principal, run_id: int, read: Callable[[int], Owned | None]) -> Owned:
    """The run `read` finds under `run_id` if the principal may see it; NotFound otherwise (an id out
    of range, from a URL, is not looked up)."""
    run = read(run_id) if 0 <= run_id <= MAX_RUN_ID else None
    if run is None:
        raise NotFound(f"run {run_id} does not exist")
    check_access(principal, run)
    return run
