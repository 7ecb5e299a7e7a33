"""Alerts: pure de-duplication rules, notification sinks, and the dispatcher that never blocks ingest."""
