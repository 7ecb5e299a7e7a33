"""Read a run's action records in pages of whole steps: one pager for `lldmon export --actions`
(server side, through the query layer or a remote API) and `trainer_hooks.history.fetch_actions`
(notebooks, over the API). Standard library only, like all of `contracts`: the pages' columns are the
callers' arrays (numpy), which the pager only compares, masks and hands to the caller's `join`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

__all__ = ["DEFAULT_PAGE_RECORDS", "MAX_ACTION_READ", "MAX_STEP", "StepTooLarge", "action_pages"]

MAX_ACTION_READ: Final = 200_000
"""The most action records one read may ask for: the `limit` cap of GET /runs/{id}/actions and of the
query layer."""
DEFAULT_PAGE_RECORDS: Final = 100_000
"""Action records per read (about 40 Search-R1 steps of 2,560 records)."""
MAX_STEP: Final = 2**63 - 1

Page = dict[str, Any]
Reader = Callable[[int | None, int | None, str | None, int], Mapping[str, Any]]
"""(step_min, step_max, source, limit) -> the action columns as numpy arrays, ordered by (step,
source, traj_index, action_index), at most `limit` records."""
Join = Callable[[list[Mapping[str, Any]]], Page]
"""Pages -> one page, their columns concatenated in order."""


class StepTooLarge(ValueError):
    """One step of one source holds more records than a single read may return."""


def action_pages(
    read: Reader,
    join: Join,
    step_min: int | None,
    step_max: int | None,
    source: str | None,
    page_records: int = DEFAULT_PAGE_RECORDS,
) -> Iterator[Page]:
    """Every action record of the step range once, in order, as non-empty pages of whole steps.

    Each read starts at the first step not yet returned; a full page (exactly `page_records` records)
    may end inside a step, so its last step is left to the next read. A single step with more records
    than a page is read alone with the largest limit, per source, and `join`ed (`StepTooLarge` if even
    that is not enough). `page_records` must be in 1..MAX_ACTION_READ (the callers check it, each with its own error).
    """
    cursor = step_min
    while step_max is None or cursor is None or cursor <= step_max:
        page = dict(read(cursor, step_max, source, page_records))
        steps = page["step"]
        if steps.size < page_records:
            if steps.size:
                yield page
            return
        last = int(steps[-1])
        whole = steps < last
        if whole.any():
            yield {name: column[whole] for name, column in page.items()}
            cursor = last
        else:  # the page is one step: read that step alone, whole
            yield join(_one_step(read, last, source))
            if last >= MAX_STEP:
                return
            cursor = last + 1


def _one_step(read: Reader, step: int, source: str | None) -> list[Mapping[str, Any]]:
    """The step read whole, one read per source."""
    parts: list[Mapping[str, Any]] = []
    for src in [source] if source is not None else ["loss", "probe"]:
        part = read(step, step, src, MAX_ACTION_READ)
        if part["step"].size >= MAX_ACTION_READ:
            raise StepTooLarge(
                f"step {step} has more than {MAX_ACTION_READ} {src} action records: too many to read"
                " in one request"
            )
        parts.append(part)
    return parts
