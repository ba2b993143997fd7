"""Named columns of one length: the tables dse computes, reports and writes, without pandas.

A question answered from the command line never imports pandas (0.23 s of a 0.5 s answer on this project's
machines): the searched space's blocks, a study's tables, its CSV files and its report are `Table`s, numpy arrays
by column. `Table.to_frame` gives the pandas DataFrame (the public API's tables); `as_table` takes a DataFrame in.

A column built from Python values gets the type pandas would give it (`column`): integers alone int64, numbers
with a float or a missing value float64 (None as NaN), booleans alone bool, anything else an object array of the
values as given. `Table.to_csv` writes what ``DataFrame.to_csv(path, index=False)`` writes of the same table
(a test holds the two equal on every shipped study's tables).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Iterator, Mapping
from numbers import Integral, Real
from pathlib import Path
from typing import Any

import numpy as np


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def column(values: Iterable[Any]) -> np.ndarray:
    """An array of ``values`` typed as pandas types a column made from them (see the module's note)."""
    values = list(values)
    present = [v for v in values if not _missing(v)]
    if present and all(isinstance(v, (bool, np.bool_)) for v in present):
        if len(present) == len(values):
            return np.array(values, dtype=bool)
    elif (present and len(present) == len(values)
          and all(isinstance(v, Integral) and not isinstance(v, (bool, np.bool_)) for v in present)):
        return np.array(values, dtype=np.int64)
    elif present and all(isinstance(v, Real) and not isinstance(v, (bool, np.bool_)) for v in present):
        return np.array([np.nan if v is None else v for v in values], dtype=np.float64)
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


class Table:
    """Columns (numpy arrays of one length) by name, in order, with a label per row (``index``; positions unless
    given). ``t["name"]`` is a column; ``t[mask]`` or ``t[positions]`` the rows chosen, labels kept.
    """

    def __init__(self, columns: Mapping[str, Any] | None = None, index: np.ndarray | None = None,
                 length: int | None = None):
        self._cols: dict[str, np.ndarray] = {}
        n = length
        for name, values in (columns or {}).items():
            a = values if isinstance(values, np.ndarray) else column(values)
            if n is None:
                n = len(a)
            elif len(a) != n:
                raise ValueError(f"column {name!r} has {len(a)} rows, not {n}")
            self._cols[str(name)] = a
        n = 0 if n is None else n
        self.index = np.arange(n) if index is None else np.asarray(index)
        if len(self.index) != n:
            raise ValueError(f"index has {len(self.index)} labels for {n} rows")

    # ---- building -------------------------------------------------------------------------------
    @classmethod
    def from_records(cls, rows: Iterable[Mapping[str, Any]], columns: Iterable[str] = ()) -> Table:
        """A table of ``rows`` (a mapping each): the columns in order of first appearance (``columns`` first, even
        without rows), a value a row lacks missing.
        """
        rows = list(rows)
        names = dict.fromkeys(columns)
        for r in rows:
            names.update(dict.fromkeys(r))
        return cls({k: column(r.get(k) for r in rows) for k in names}, length=len(rows))

    @classmethod
    def from_frame(cls, frame: Any) -> Table:
        """A pandas DataFrame's columns and labels; a column of a pandas extension type (nullable integers, ...)
        as an object array of its Python values, a missing one None.
        """
        return cls({str(k): _values(frame[k]) for k in frame.columns}, index=frame.index.to_numpy(), length=len(frame))

    def to_frame(self) -> Any:
        """The pandas DataFrame of the table (object columns given as lists, typed as pandas types them)."""
        import pandas as pd

        return pd.DataFrame({k: (a.tolist() if a.dtype == object else a) for k, a in self._cols.items()},
                            index=None if np.array_equal(self.index, np.arange(len(self))) else self.index,
                            columns=list(self._cols))

    # ---- reading --------------------------------------------------------------------------------
    @property
    def columns(self) -> list[str]:
        return list(self._cols)

    @property
    def empty(self) -> bool:
        return len(self) == 0 or not self._cols

    def __len__(self) -> int:
        return len(self.index)

    def __contains__(self, name: object) -> bool:
        return name in self._cols

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return self._cols[key]
        return self.take(key)

    def __setitem__(self, name: str, values: Any) -> None:
        a = np.asarray(values) if not isinstance(values, list) else column(values)
        if a.ndim == 0:
            a = np.full(len(self), a[()])
        if len(a) != len(self):
            raise ValueError(f"column {name!r} has {len(a)} rows, not {len(self)}")
        self._cols[name] = a

    def get(self, name: str, default: Any = None) -> Any:
        return self._cols.get(name, default)

    def items(self) -> Iterator[tuple[str, np.ndarray]]:
        return iter(self._cols.items())

    def take(self, rows: Any) -> Table:
        """The rows at ``rows`` (positions, a boolean mask or a slice), their labels kept."""
        if isinstance(rows, slice):
            rows = np.arange(len(self))[rows]
        rows = np.asarray(rows)
        return Table({k: a[rows] for k, a in self._cols.items()}, index=self.index[rows], length=len(self.index[rows]))

    def select(self, names: Iterable[str]) -> Table:
        """The columns ``names``, in that order."""
        return Table({k: self._cols[k] for k in names}, index=self.index, length=len(self))

    def row(self, i: int) -> dict[str, Any]:
        """Row at position ``i``: a value per column, as Python values."""
        return {k: _native(a[i]) for k, a in self._cols.items()}

    def loc(self, label: Any) -> dict[str, Any]:
        """Row labelled ``label``."""
        (at,) = np.flatnonzero(self.index == label)
        return self.row(int(at))

    def records(self) -> list[dict[str, Any]]:
        """Every row as a dict of Python values (column order kept)."""
        cols = [[_native(v) for v in a] for a in self._cols.values()]
        names = list(self._cols)
        return [dict(zip(names, r, strict=True)) for r in zip(*cols, strict=True)] if cols else [{} for _ in self.index]

    def duplicated(self, subset: Iterable[str]) -> np.ndarray:
        """Whether each row repeats an earlier row's values in the columns ``subset``."""
        cols = [self._cols[k] for k in subset]
        out = np.ones(len(self), dtype=bool)
        if all(c.dtype.kind in "biuf" for c in cols):
            _, first = np.unique(np.stack(cols, axis=1), axis=0, return_index=True)
            out[first] = False
            return out
        seen: set = set()
        for i, key in enumerate(zip(*(c.tolist() for c in cols), strict=True)):
            out[i] = key in seen
            seen.add(key)
        return out

    # ---- writing --------------------------------------------------------------------------------
    def to_csv(self, path: str | Path) -> None:
        """The table as ``DataFrame.to_csv(path, index=False)`` writes it: a header, a row per row, missing values
        empty, numbers as their shortest repr, quotes only where a value needs them.
        """
        cols = [_csv_cells(a) for a in self._cols.values()]
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(self._cols)
            w.writerows(zip(*cols, strict=True) if cols else ([] for _ in self.index))


def _values(series: Any) -> np.ndarray:
    if isinstance(series.dtype, np.dtype):
        return series.to_numpy()
    import pandas as pd  # the frame's own library, imported already

    out = np.empty(len(series), dtype=object)
    out[:] = [None if v is pd.NA else v for v in series.tolist()]
    return out


def _native(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v


def _csv_cells(a: np.ndarray) -> list[str]:
    if a.dtype.kind == "f":
        return ["" if math.isnan(v) else repr(v) for v in a.tolist()]
    if a.dtype.kind in "iub":
        return [str(v) for v in a.tolist()]
    return ["" if _missing(v) else str(v) for v in a.tolist()]


def as_table(table: Any) -> Table:
    """``table`` as a `Table` (a pandas DataFrame converted, a Table as it is)."""
    return table if isinstance(table, Table) else Table.from_frame(table)
