"""Integer columns read from PostgreSQL as one value each: the whole column packed by the database into
one string of 8-byte big-endian integers, unpacked by numpy without a Python object per value.

The matcher's catalogue and hold book (broker.catalog, federation.selectors) read 100,000 rows this way in
a fraction of what a row per island through the ORM costs. Aggregates of one scan see its rows in one
order, so several packed columns of one statement are aligned.
"""

from __future__ import annotations

import numpy as np


def packed_ints(expression: str) -> str:
    """An aggregate packing the integer SQL ``expression`` of every row into one ``bytea`` (NULL over no
    rows). ``expression`` is SQL written by the caller: names from model metadata, never values."""
    return f"string_agg(int8send(({expression})::bigint), ''::bytea)"


def unpacked_ints(raw: bytes) -> np.ndarray:
    """The int64 array a ``packed_ints`` aggregate returned."""
    return np.frombuffer(raw, dtype=">i8").astype(np.int64)
