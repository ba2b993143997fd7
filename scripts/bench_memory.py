"""Benchmark: peak memory of a study against the number of configurations it searches.

Each point runs one `cheapest` study in a fresh process (``dse.run``, both deployment modes, every integer
batch of every block, summary and report written) and reports the configurations of its space, the wall time
and the process's peak resident memory (``ru_maxrss``). The space grows through the batch range per rank,
the systems, layouts, formats and KV tiers searched, on a short request (64-token prompt, 64 output tokens)
so that HBM admits large batches. The searches stream the pairs in chunks of whole blocks
(``dse.optimize.space.CHUNK_PAIRS``), so the peak should stay flat once the space exceeds one chunk;
``--chunk`` sets another chunk size to show the difference (a chunk larger than the space holds it all at
once, as the search did before it streamed).

Usage: python scripts/bench_memory.py [--max 1e8] [--chunk N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, resource, sys, time
import dse.optimize.space as space
study, out, chunk = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
if chunk:
    space.CHUNK_PAIRS = chunk
import dse
t0 = time.perf_counter()
r = dse.run(study, out=out)
wall = time.perf_counter() - t0
configurations = sum(s["configurations"] for s in r.summary["spaces"])
print(json.dumps({"configurations": configurations, "wall_s": wall, "status": r.summary["status"],
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""

NARROW = {"weights_dtypes": ["bf16", "fp8"], "kv_dtypes": ["bf16", "fp8"], "kv_tiers": ["hbm"], "pp": [1, 2],
          "max_racks": 1, "max_chips_per_stage": 8}
WIDE = {"weights_dtypes": ["bf16", "fp8", "fp4"], "kv_dtypes": ["bf16", "fp8", "fp4"], "kv_tiers": ["hbm", "host"],
        "pp": [1, 2, 4], "max_racks": 4, "max_chips_per_stage": 512}
# spaces of Llama 3.1 8B at 64 + 64 tokens from about 4e3 to 2e8 configurations
POINTS = [
    {"max_batch_per_rank": 64, "systems": ["h100"], **NARROW},
    {"max_batch_per_rank": 512, "systems": ["h100", "h200"], **NARROW},
    {"max_batch_per_rank": 4096, "systems": ["h100", "h200", "b200"], **NARROW},
    {"max_batch_per_rank": 16384, "systems": ["h100", "h200", "b200", "mi300x", "mi325x"], **NARROW},
    {"max_batch_per_rank": 65536, "systems": "all", **NARROW},
    {"max_batch_per_rank": 65536, "systems": "all", **NARROW, "pp": [1, 2], "max_racks": 4,
     "max_chips_per_stage": 512},
    {"max_batch_per_rank": 65536, "systems": "all", **WIDE},
]


def study(k: int, space: dict) -> dict:
    return {
        "study": f"bench_memory_{k}", "kind": "cheapest",
        "description": "peak memory against the size of the space", "expect": "flat above one chunk",
        "models": ["llama-3.1-8b"],
        "workloads": [{"name": "short", "prompt": 64, "output": 64, "tpot_max_s": 10.0}],
        "space": {"tp": [1, 2, 4, 8], **space, "serving": ["aggregated", "disaggregated"]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max", type=float, default=1e8, help="largest space to run (configurations)")
    parser.add_argument("--chunk", type=int, default=0, help="pairs per chunk (default: the search's own)")
    args = parser.parse_args()
    print(f"{'configurations':>15} {'wall s':>8} {'peak RSS MB':>12}  status")
    for k, space in enumerate(POINTS):
        with tempfile.TemporaryDirectory() as tmp:
            p = subprocess.run([sys.executable, "-c", CHILD, json.dumps(study(k, space)),
                                os.path.join(tmp, "out"), str(args.chunk)], capture_output=True, text=True,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
        if p.returncode:
            print(f"point {k}: failed\n{p.stderr[-2000:]}")
            return
        r = json.loads(p.stdout.strip().splitlines()[-1])
        print(f"{r['configurations']:>15,} {r['wall_s']:>8.1f} {r['peak_rss_bytes'] / 1e6:>12.0f}  {r['status']}",
              flush=True)
        if r["configurations"] >= args.max:
            break


if __name__ == "__main__":
    main()
