"""In-memory stand-in for Hugging Face `datasets` on the GPU lab's bare machine (see ../README.md).

Only what TRL's GRPO trainer and `examples/search_r1_grpo.py` use: a table of rows built from columns
(`Dataset.from_dict`), indexed by row or column, and the class names TRL checks with `isinstance`.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

__version__ = "0.0.0+lldmon.gpu.lab.stand.in"

_STAND_IN = "the GPU lab's stand-in for `datasets` (scripts/gpu-lab-shim)"


class Dataset:
    """Rows of equal keys, held in memory."""

    def __init__(self, rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> None:
        self._rows = [dict(row) for row in rows]
        self._columns = list(columns)

    @classmethod
    def from_dict(cls, mapping: Mapping[str, Sequence[Any]], **kwargs: Any) -> Dataset:
        lengths = {name: len(values) for name, values in mapping.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"columns of different lengths: {lengths}")
        n = next(iter(lengths.values()), 0)
        rows = [{name: mapping[name][i] for name in mapping} for i in range(n)]
        return cls(rows, list(mapping))

    @classmethod
    def from_list(cls, rows: Sequence[Mapping[str, Any]], **kwargs: Any) -> Dataset:
        columns = list(rows[0]) if rows else []
        return cls(rows, columns)

    @property
    def column_names(self) -> list[str]:
        return list(self._columns)

    @property
    def cache_files(self) -> list[dict[str, str]]:
        """None: the table lives in memory (TRL reports the data source from this)."""
        return []

    @property
    def num_rows(self) -> int:
        return len(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(dict(row) for row in self._rows)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            if key not in self._columns:
                raise KeyError(key)
            return [row[key] for row in self._rows]
        if isinstance(key, slice):
            rows = self._rows[key]
            return {name: [row[name] for row in rows] for name in self._columns}
        if isinstance(key, int):
            return dict(self._rows[key])
        return {name: [self._rows[int(i)][name] for i in key] for name in self._columns}

    def select(self, indices: Sequence[int], **kwargs: Any) -> Dataset:
        return Dataset([self._rows[int(i)] for i in indices], self._columns)

    def shuffle(self, seed: int | None = None, **kwargs: Any) -> Dataset:
        order = list(range(len(self._rows)))
        random.Random(seed).shuffle(order)
        return self.select(order)

    def __repr__(self) -> str:
        return f"Dataset(stand-in; features: {self._columns}, num_rows: {len(self._rows)})"


class IterableDataset:
    """Never built here; TRL only checks `isinstance` against it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(f"IterableDataset is not available in {_STAND_IN}")


class DatasetDict(dict):  # type: ignore[type-arg]
    """A dict of splits (TRL checks `isinstance` against it)."""


class IterableDatasetDict(dict):  # type: ignore[type-arg]
    """A dict of streaming splits (TRL checks `isinstance` against it)."""


def __getattr__(name: str) -> Any:
    raise AttributeError(f"datasets.{name} is not available in {_STAND_IN}")
