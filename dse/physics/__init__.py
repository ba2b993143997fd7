"""Physics: the vectorized roofline of one replica, layouts, per-layer times, training steps.

`keep_freed_memory` keeps the memory numpy frees inside the process (glibc's ``mallopt``: no ``mmap`` below
32 MiB, no trimming below 256 MiB free). The evaluator's temporaries are arrays of a chunk of candidates, allocated
and freed by the hundred per call; by default glibc hands each freed one back to the system and page-faults it in
again on the next allocation, some 40% of the evaluator's time. The memory a process holds then stays at its peak,
which the chunked searches bound. It is a setting of the whole process, so the library never makes it on import:
the `dse` command makes it at start (and the benchmarks do); a program that calls the Python API may call it too.
"""

from __future__ import annotations


def keep_freed_memory() -> None:
    """Set glibc's mmap and trim thresholds (nothing where the C library is not glibc)."""
    import ctypes
    import os

    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return
        libc = ctypes.CDLL(None)
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD: arrays below 32 MiB come from the heap
        libc.mallopt(-1, 256 << 20)  # M_TRIM_THRESHOLD: keep up to 256 MiB of freed heap
    except (ValueError, OSError, AttributeError):
        return

