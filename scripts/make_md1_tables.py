"""Write the M/D/1 wait-quantile tables that ship with the package (`dse.physics.queueing.TABLES_FILE`).

    python scripts/make_md1_tables.py [--check]

Each table is `dse.physics.queueing.build_table` of one of `QUANTILES` (the grid z and x_q at each node), stored with
the settings it depends on (`table_parameters`); the module reads a table from the file only when those settings are
today's. Rerun after changing the grid, the bisection or the distribution; `--check` rebuilds the tables and exits 1
when they differ from the file (``tests/test_queueing.py`` does the same). The file is stored uncompressed (0.54 MB
against 0.37 MB): a question reads it in about 1 ms instead of 5-15 ms of inflating it.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from dse.physics import queueing as Q


def tables() -> dict[str, np.ndarray]:
    """The arrays of the file: quantiles, parameters, and z<i>, x<i> per quantile."""
    out = {"quantiles": np.array(Q.QUANTILES, dtype=np.float64), "parameters": Q.table_parameters()}
    for i, q in enumerate(Q.QUANTILES):
        out[f"z{i}"], out[f"x{i}"] = Q.build_table(q)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true", help="compare with the shipped file instead of writing it")
    a = parser.parse_args()
    built = tables()
    if a.check:
        with np.load(Q.TABLES_FILE, allow_pickle=False) as shipped:
            same = set(shipped.files) == set(built) and all(np.array_equal(shipped[k], v) for k, v in built.items())
        print(f"{Q.TABLES_FILE}: {'the same' if same else 'DIFFERENT'}")
        sys.exit(0 if same else 1)
    np.savez(Q.TABLES_FILE, **built)
    print(f"wrote {Q.TABLES_FILE} ({', '.join(f'{k} {v.size}' for k, v in built.items())})")


if __name__ == "__main__":
    main()
