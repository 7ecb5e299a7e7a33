"""lldmon's ingest and query service (FastAPI on SQLAlchemy). Never imports torch."""
