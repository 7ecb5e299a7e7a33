"""Small importers of trainer logs into canonical metric columns (a later issue builds the full ones).

`read_*` return `(steps, {canonical name: values})`; `load_*` return a `ParsedLog` that also says where a
value was logged (so a logged NaN grad norm is told apart from a missing one).
"""

from monitor.importers.names import TRL_NAMES, VERL_NAMES, canonical_name
from monitor.importers.parsed import ParsedLog, merge_records, to_columns
from monitor.importers.trl_stdout import load_trl_stdout, parse_trl_stdout, read_trl_stdout
from monitor.importers.verl_console import load_verl_console, parse_verl_console, read_verl_console

__all__ = [
    "TRL_NAMES",
    "VERL_NAMES",
    "ParsedLog",
    "canonical_name",
    "load_trl_stdout",
    "load_verl_console",
    "merge_records",
    "parse_trl_stdout",
    "parse_verl_console",
    "read_trl_stdout",
    "read_verl_console",
    "to_columns",
]
