"""Alembic migrations: the schema's source of truth (run with `lldmon db upgrade`)."""
