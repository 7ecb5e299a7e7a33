"""Read a run's action records in pages: one pager for `lldmon export --actions` (server side, through
the query layer or a remote API) and `trainer_hooks.history.fetch_actions` (notebooks, over the API).
Standard library only, like all of `contracts`: the pages' columns are the callers' arrays (numpy), which
the pager only compares, masks and hands back.

Records are ordered by their key (step, source, traj_index, action_index), which is unique in a run, so
each read asks for the records after the last one returned (`ActionCursor`): a page may end and the next
begin inside a step, and a step of any size is read whole over several pages, never skipped and never
too large for a read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final, NamedTuple

__all__ = [
    "DEFAULT_PAGE_RECORDS",
    "MAX_ACTION_READ",
    "ActionCursor",
    "PagingUnsupported",
    "action_pages",
]

MAX_ACTION_READ: Final = 200_000
"""The most action records one read may ask for: the `limit` cap of GET /runs/{id}/actions and of the
query layer."""
DEFAULT_PAGE_RECORDS: Final = 100_000
"""Action records per read (about 40 Search-R1 steps of 2,560 records)."""


class ActionCursor(NamedTuple):
    """The key of the last record read: the next read returns the records after it (in key order).
    GET /runs/{id}/actions takes it as `after_step`, `after_source`, `after_traj_index`,
    `after_action_index`."""

    step: int
    source: str
    traj_index: int
    action_index: int


Page = dict[str, Any]
Reader = Callable[[int | None, int | None, str | None, int, ActionCursor | None], Mapping[str, Any]]
"""(step_min, step_max, source, limit, after) -> the action columns as numpy arrays, ordered by (step,
source, traj_index, action_index), at most `limit` records, only those after `after` when it is given."""


class PagingUnsupported(ValueError):
    """The reader ignored the cursor (a service older than paging inside a step) and a page ended in a
    step whose records up to there fill a page: the rest of that step cannot be reached."""


def action_pages(
    read: Reader,
    step_min: int | None,
    step_max: int | None,
    source: str | None,
    page_records: int = DEFAULT_PAGE_RECORDS,
) -> Iterator[Page]:
    """Every action record of the step range once, in key order, as non-empty pages of at most
    `page_records` records (a page may end inside a step). `page_records` must be in
    1..MAX_ACTION_READ (the callers check it, each with its own error).

    Each read after the first passes the last record's key as its cursor and, as its `step_min`, that
    record's step: a reader that ignores the cursor then answers from the start of that step, and the
    records up to the cursor are dropped here, so such a service still serves a run whose steps are
    smaller than a page (`PagingUnsupported` where a page ends in a step that fills it)."""
    after: ActionCursor | None = None
    while True:
        lo = step_min if after is None else after.step
        page = dict(read(lo, step_max, source, page_records, after))
        size = int(page["step"].size)
        if after is not None and size and _key(page, 0) <= after:  # the cursor was ignored
            keep = _after(page, after)
            page = {name: column[keep] for name, column in page.items()}
            if size >= page_records and not page["step"].size:
                raise PagingUnsupported(
                    f"step {after.step} holds at least {page_records} action records up to "
                    f"{after.source} record ({after.traj_index}, {after.action_index}) and the service "
                    "cannot read a step in parts (it is older than this client): upgrade it, or read "
                    "with larger pages"
                )
        if page["step"].size:
            yield page
            after = _key(page, int(page["step"].size) - 1)
        if size < page_records:
            return


def _key(page: Mapping[str, Any], i: int) -> ActionCursor:
    return ActionCursor(
        int(page["step"][i]), str(page["source"][i]), int(page["traj_index"][i]), int(page["action_index"][i])
    )


def _after(page: Mapping[str, Any], cursor: ActionCursor) -> Any:
    """Mask of the page's records whose key is greater than `cursor` (columns compared element-wise)."""
    step, source, traj, action = (page[n] for n in ("step", "source", "traj_index", "action_index"))
    later_in_block = (traj > cursor.traj_index) | (
        (traj == cursor.traj_index) & (action > cursor.action_index)
    )
    later_in_step = (source > cursor.source) | ((source == cursor.source) & later_in_block)
    return (step > cursor.step) | ((step == cursor.step) & later_in_step)
