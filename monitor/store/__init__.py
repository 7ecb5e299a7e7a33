"""The only code that writes SQL. Functions take a Connection and return domain objects."""

from monitor.store.database import Database

__all__ = ["Database"]
