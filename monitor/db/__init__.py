"""Database schema (SQLAlchemy models), engines and migrations glue."""
