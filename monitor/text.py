"""User-supplied text made safe for a terminal, a log line or a chat message: one escape for every
output boundary (the CLI, the log sink, the Slack text), so that no path shows a name differently or
lets one act.

Run, project, tag, token and metric names, alert texts, reasons and error messages come from token
holders (or quote their input): a newline forges a line or a table row, an ANSI or OSC sequence clears
the screen or sets the window title, a bidi override reorders what is shown."""

from __future__ import annotations

import unicodedata
from typing import Final

_INVISIBLE: Final = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
"""Unicode categories written as escapes: controls, format characters (bidi overrides, zero-width),
lone surrogates, line and paragraph separators."""


def printable(text: str) -> str:
    """`text` on one line with nothing invisible: control, format and line/paragraph-separator
    characters (newline, carriage return, ESC of ANSI sequences, bidi overrides, U+2028) are written as
    Python escapes (`\\n`, `\\x1b`, `\\u202e`), and so is the backslash, so an escape in a name cannot
    pass for one of these."""
    return "".join(_escape_char(ch) for ch in text)


def _escape_char(ch: str) -> str:
    if ch == "\\":
        return "\\\\"
    if unicodedata.category(ch) not in _INVISIBLE:
        return ch
    code = ord(ch)
    if code < 0x100:
        return repr(ch)[1:-1]  # \n, \r, \t, \x1b, \x85
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"
