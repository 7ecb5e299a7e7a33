"""Use cases between the HTTP layer and the store: auth, runs, ingest, query."""
