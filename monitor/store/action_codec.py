"""Action records of one (run, step, source) as one packed, compressed block (revision 0007).

Why blocks: one database row per action record cost about 161 bytes on disk (tuple header, row,
primary-key index) and made storage and ingest scale with actions. A block per step costs a row per
step and about 10 bytes per record, and readers decode whole columns with numpy.

Format (version 1), little-endian, lossless:

    header  b"LLDA" | version u8 | n u32 | one dtype code u8 per column (ACTION_FIELDS order)
    body    zlib (level 1) of the columns' byte-shuffled buffers, in ACTION_FIELDS order

- `traj_index` (sorted) is stored as differences from the previous value (the first from 0), in the
  smallest unsigned type holding them (modulo 2**64, so any int64 range round-trips);
- `action_index` and `n_tokens` in the smallest of int8/int16/int32/int64 holding them;
- float columns as float32 when every value round-trips exactly through float32 (the hooks send
  float32 tensors), else float64 (XOR with the previous value, as in Gorilla, measured no smaller
  after shuffling: the repeats within a trajectory already compress);
- `is_answer` as packed bits.
Byte shuffling (all first bytes, then all second bytes, ...) groups the bytes that are alike (signs
and exponents) so that zlib finds them; level 1 compresses as well as 6 here at a fraction of the time.

This module is pure numpy + zlib: no SQL, no I/O. Stored blocks outlive the code that wrote them, so
`decode_block` must keep reading every version written so far (revision 0007 writes version 1 with its
own frozen copy of this codec).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

ACTION_FIELDS = (
    "traj_index",
    "action_index",
    "n_tokens",
    "delta",
    "old_logp_mean",
    "advantage",
    "reward",
    "is_answer",
)
SUMMARY_LEVELS: tuple[float, ...] = (0.1, 0.25, 0.5, 0.75, 0.9)
"""Quantile levels of the per-step delta summary stored with every block (kept after pruning)."""

INT_FIELDS = ("traj_index", "action_index", "n_tokens")
FLOAT_FIELDS = ("delta", "old_logp_mean", "advantage", "reward")

MAGIC = b"LLDA"
VERSION = 1
_HEADER = struct.Struct(f"<4sBI{len(ACTION_FIELDS)}B")
_ZLIB_LEVEL = 1

# dtype codes of the header; _BITS: packed booleans
_BITS = 11
_CODES: dict[int, np.dtype[Any]] = {
    1: np.dtype("<i1"),
    2: np.dtype("<i2"),
    3: np.dtype("<i4"),
    4: np.dtype("<i8"),
    5: np.dtype("<u1"),
    6: np.dtype("<u2"),
    7: np.dtype("<u4"),
    8: np.dtype("<u8"),
    9: np.dtype("<f4"),
    10: np.dtype("<f8"),
}
_CODE_OF = {dtype: code for code, dtype in _CODES.items()}
_ALLOWED = {
    "traj_index": {5, 6, 7, 8},
    "action_index": {1, 2, 3, 4},
    "n_tokens": {1, 2, 3, 4},
    "delta": {9, 10},
    "old_logp_mean": {9, 10},
    "advantage": {9, 10},
    "reward": {9, 10},
    "is_answer": {_BITS},
}
_SIGNED = (np.dtype("<i1"), np.dtype("<i2"), np.dtype("<i4"), np.dtype("<i8"))
_UNSIGNED = (np.dtype("<u1"), np.dtype("<u2"), np.dtype("<u4"), np.dtype("<u8"))


@dataclass(frozen=True)
class Block:
    """The records of one (run, step, source): equal-length arrays sorted by (traj_index,
    action_index) with unique keys. Missing floats are NaN, +-inf are kept."""

    traj_index: np.ndarray  # int64
    action_index: np.ndarray  # int64
    n_tokens: np.ndarray  # int64
    delta: np.ndarray  # float64
    old_logp_mean: np.ndarray  # float64
    advantage: np.ndarray  # float64
    reward: np.ndarray  # float64
    is_answer: np.ndarray  # bool

    def __post_init__(self) -> None:
        n = len(self.traj_index)
        if any(len(getattr(self, f.name)) != n for f in fields(self)):
            raise ValueError("action block columns must have equal lengths")

    def __len__(self) -> int:
        return len(self.traj_index)


def empty_block() -> Block:
    return _block(
        np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64), *_floats(0), np.empty(0, bool)
    )


def block_from_columns(columns: Mapping[str, Sequence[Any] | np.ndarray]) -> Block:
    """A block from columns keyed by ACTION_FIELDS (other keys ignored): None -> NaN, sorted by key,
    and of records listed twice the later one wins (as for a re-sent record)."""
    try:
        ints = [np.asarray(columns[name], dtype=np.int64) for name in INT_FIELDS]
        floats = [np.asarray(columns[name], dtype=np.float64) for name in FLOAT_FIELDS]
        is_answer = np.asarray(columns["is_answer"], dtype=bool)
    except KeyError as exc:
        raise ValueError(f"action columns lack {exc.args[0]!r}") from None
    return _canonical(_block(*ints, *floats, is_answer))


def merge_blocks(old: Block, new: Block) -> Block:
    """The union of two blocks of one step, keyed by (traj_index, action_index): new records win."""
    if len(new) == 0:
        return old
    if len(old) == 0:
        return new
    return _canonical(
        _block(*(np.concatenate([getattr(old, name), getattr(new, name)]) for name in ACTION_FIELDS))
    )


def encode_block(block: Block) -> bytes:
    n = len(block)
    if n >= 2**32:
        raise ValueError(f"an action block holds at most 2**32 - 1 records, got {n}")
    codes: list[int] = []
    parts: list[bytes] = []
    for name in ACTION_FIELDS:
        values = getattr(block, name)
        if name == "is_answer":
            codes.append(_BITS)
            parts.append(np.packbits(values.astype(bool, copy=False), bitorder="little").tobytes())
            continue
        if name == "traj_index":
            raw = values.astype(np.int64, copy=False).view(np.uint64)
            stored = np.diff(raw, prepend=np.uint64(0))  # wraps modulo 2**64, exact both ways
            stored = stored.astype(_smallest(stored, _UNSIGNED), copy=False)
        elif name in INT_FIELDS:
            stored = values.astype(_smallest(values, _SIGNED), copy=False)
        else:
            stored = _narrow_float(values)
        codes.append(_CODE_OF[stored.dtype])
        parts.append(_shuffle(stored))
    header = _HEADER.pack(MAGIC, VERSION, n, *codes)
    return header + zlib.compress(b"".join(parts), _ZLIB_LEVEL)


def decode_block(payload: bytes) -> Block:
    """The block of an `encode_block` payload; ValueError naming the problem if it is not one."""
    payload = bytes(payload)  # memoryview from some drivers
    if len(payload) < _HEADER.size:
        raise ValueError(f"action block payload too short ({len(payload)} bytes) for its header")
    magic, version, n, *codes = _HEADER.unpack_from(payload)
    if magic != MAGIC:
        raise ValueError(f"not an action block payload (magic {magic!r}, expected {MAGIC!r})")
    if version != VERSION:
        raise ValueError(f"unknown action block version {version} (this lldmon reads {VERSION})")
    sizes: list[int] = []
    dtypes: list[np.dtype[Any] | None] = []
    for name, code in zip(ACTION_FIELDS, codes, strict=True):
        if code not in _ALLOWED[name]:
            raise ValueError(f"corrupt action block: column {name!r} has invalid type code {code}")
        dtype = _CODES.get(code)
        dtypes.append(dtype)
        sizes.append((n + 7) // 8 if dtype is None else n * dtype.itemsize)
    expected = sum(sizes)
    inflater = zlib.decompressobj()
    try:
        body = inflater.decompress(payload[_HEADER.size :], expected + 1)
    except zlib.error as exc:
        raise ValueError(f"corrupt action block: compressed body does not inflate ({exc})") from None
    if len(body) != expected or not inflater.eof or inflater.unused_data or inflater.unconsumed_tail:
        raise ValueError(
            f"corrupt action block: body holds {len(body)} bytes"
            f"{'' if inflater.eof else ' (truncated)'}, header announces {n} records ({expected} bytes)"
        )
    columns: dict[str, np.ndarray] = {}
    offset = 0
    for name, dtype, size in zip(ACTION_FIELDS, dtypes, sizes, strict=True):
        chunk = body[offset : offset + size]
        offset += size
        if dtype is None:
            columns[name] = np.unpackbits(np.frombuffer(chunk, np.uint8), count=n, bitorder="little").astype(
                bool
            )
            continue
        stored = _unshuffle(chunk, dtype, n)
        if name == "traj_index":
            columns[name] = np.cumsum(stored.astype(np.uint64), dtype=np.uint64).view(np.int64)
        elif name in INT_FIELDS:
            columns[name] = stored.astype(np.int64)
        else:
            columns[name] = stored.astype(np.float64)
    block = _block(*(columns[name] for name in ACTION_FIELDS))
    if n > 1:
        t, a = block.traj_index, block.action_index
        if not np.all((t[1:] > t[:-1]) | ((t[1:] == t[:-1]) & (a[1:] > a[:-1]))):
            raise ValueError(
                "corrupt action block: records are not sorted by unique (traj_index, action_index)"
            )
    return block


def summarize(block: Block) -> dict[str, Any]:
    """JSON-able per-step summary kept after pruning: quantiles (numpy's linear method, pandas'
    default) of the finite deltas of all records and of the records with advantage > 0."""
    finite = np.isfinite(block.delta)
    positive = finite & (block.advantage > 0)
    return {
        "levels": list(SUMMARY_LEVELS),
        "all": _quantiles(block.delta[finite]),
        "pos": _quantiles(block.delta[positive]),
    }


def records_after(block: Block, traj_index: int, action_index: int) -> Block:
    """The block's records whose key (traj_index, action_index) is greater than the one given (the rest
    of a step read in parts; the block is sorted by key)."""
    keep = (block.traj_index > traj_index) | (
        (block.traj_index == traj_index) & (block.action_index > action_index)
    )
    return _block(*(getattr(block, name)[keep] for name in ACTION_FIELDS))


def concat_columns(blocks: Sequence[tuple[int, str, Block]]) -> dict[str, np.ndarray]:
    """The records of several blocks as columns `step`, `source` and ACTION_FIELDS, block after block."""
    sizes = np.asarray([len(block) for _, _, block in blocks], dtype=np.int64)
    out: dict[str, np.ndarray] = {
        "step": np.repeat(np.asarray([step for step, _, _ in blocks], dtype=np.int64), sizes),
        "source": np.repeat(np.asarray([source for _, source, _ in blocks], dtype=object), sizes),
    }
    empty = empty_block()
    for name in ACTION_FIELDS:
        parts = [getattr(block, name) for _, _, block in blocks]
        out[name] = np.concatenate(parts) if parts else getattr(empty, name)
    return out


# --- internals ---------------------------------------------------------------------------------


def _block(*columns: np.ndarray) -> Block:
    return Block(**dict(zip(ACTION_FIELDS, columns, strict=True)))


def _floats(n: int) -> list[np.ndarray]:
    return [np.empty(n, np.float64) for _ in FLOAT_FIELDS]


def _canonical(block: Block) -> Block:
    """Sorted by (traj_index, action_index); of equal keys the last one (stable sort) is kept."""
    t, a = block.traj_index, block.action_index
    n = len(t)
    if n == 0:
        return block
    if n > 1 and np.all((t[1:] > t[:-1]) | ((t[1:] == t[:-1]) & (a[1:] > a[:-1]))):
        return block  # already canonical (the usual case: the hooks send records in order)
    order = np.lexsort((a, t))
    ts, as_ = t[order], a[order]
    keep = np.ones(n, dtype=bool)
    keep[:-1] = (ts[1:] != ts[:-1]) | (as_[1:] != as_[:-1])
    index = order[keep]
    return _block(*(getattr(block, name)[index] for name in ACTION_FIELDS))


def _smallest(values: np.ndarray, candidates: tuple[np.dtype[Any], ...]) -> np.dtype[Any]:
    if len(values) == 0:
        return candidates[0]
    lo, hi = values.min(), values.max()
    for dtype in candidates:
        info = np.iinfo(dtype)
        if info.min <= lo and hi <= info.max:
            return dtype
    return candidates[-1]


def _narrow_float(values: np.ndarray) -> np.ndarray:
    """float32 if that is exact for every value (NaN counts as exact), else float64."""
    values = values.astype("<f8", copy=False)
    with np.errstate(over="ignore", invalid="ignore"):
        narrow = values.astype("<f4")
    same = (narrow.astype("<f8") == values) | (np.isnan(values) & np.isnan(narrow))
    return narrow if bool(np.all(same)) else values


def _shuffle(values: np.ndarray) -> bytes:
    values = np.ascontiguousarray(values)
    if values.dtype.itemsize == 1:
        return values.tobytes()
    return values.view(np.uint8).reshape(len(values), values.dtype.itemsize).T.tobytes()


def _unshuffle(chunk: bytes, dtype: np.dtype[Any], n: int) -> np.ndarray:
    raw = np.frombuffer(chunk, np.uint8)
    if dtype.itemsize == 1:
        return raw.view(dtype).copy()
    return np.ascontiguousarray(raw.reshape(dtype.itemsize, n).T).view(dtype).reshape(n)


def _quantiles(values: np.ndarray) -> dict[str, Any]:
    n = len(values)
    if n == 0:
        return {"n": 0, "q": [None] * len(SUMMARY_LEVELS)}
    with np.errstate(over="ignore", invalid="ignore"):
        q = np.quantile(values, SUMMARY_LEVELS)
    if not np.all(np.isfinite(q)):  # b - a overflowed (values near +-1.8e308): the convex form cannot
        ordered = np.sort(values)
        position = np.asarray(SUMMARY_LEVELS) * (n - 1)
        lo = np.floor(position).astype(np.int64)
        t = position - lo
        q = ordered[lo] * (1 - t) + ordered[np.minimum(lo + 1, n - 1)] * t
    return {"n": n, "q": [float(v) for v in q]}


def search_r1_step(rng: np.random.Generator, n_records: int = 2560, actions_per_traj: int = 4) -> Block:
    """A synthetic Search-R1-shaped step (benchmarks and the size figure below): trajectories of 1 to
    2 * actions_per_traj - 1 actions (mean actions_per_traj), float32 values, advantage and reward
    constant within a trajectory (GRPO groups of 5), the last action of a trajectory the answer."""
    lengths = rng.integers(1, 2 * actions_per_traj, size=n_records)  # more than enough trajectories
    lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), n_records)) + 1]
    lengths[-1] -= int(lengths.sum()) - n_records
    n_traj = len(lengths)
    traj = np.repeat(np.arange(n_traj), lengths)
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    action = np.arange(n_records) - starts
    reward_traj = (rng.random(n_traj) < 0.4).astype(np.float32)
    groups = reward_traj[: n_traj - n_traj % 5].reshape(-1, 5)
    adv_groups = (groups - groups.mean(axis=1, keepdims=True)) / (groups.std(axis=1, keepdims=True) + 1e-4)
    adv_traj = np.zeros(n_traj, np.float32)
    adv_traj[: groups.size] = adv_groups.ravel()
    is_answer = np.zeros(n_records, bool)
    is_answer[np.cumsum(lengths) - 1] = True
    return _block(
        traj.astype(np.int64),
        action.astype(np.int64),
        rng.integers(8, 256, n_records).astype(np.int64),
        rng.normal(0.0, 0.05, n_records).astype(np.float32).astype(np.float64),
        (-rng.gamma(2.0, 0.4, n_records)).astype(np.float32).astype(np.float64),
        np.repeat(adv_traj, lengths).astype(np.float64),
        np.repeat(reward_traj, lengths).astype(np.float64),
        is_answer,
    )


def _main() -> None:
    import time

    rng = np.random.default_rng(0)
    blocks = [search_r1_step(rng) for _ in range(50)]
    start = time.perf_counter()
    payloads = [encode_block(b) for b in blocks]
    encoded = time.perf_counter()
    for p in payloads:
        decode_block(p)
    decoded = time.perf_counter()
    records = sum(len(b) for b in blocks)
    size = sum(len(p) for p in payloads)
    print(
        f"Search-R1-shaped steps: {records // len(blocks)} records each, payload {size / records:.2f} B/record; "
        f"encode {1e9 * (encoded - start) / records:.0f} ns/record, decode {1e9 * (decoded - encoded) / records:.0f} ns/record"
    )


if __name__ == "__main__":
    _main()
