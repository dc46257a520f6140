"""bench/mods.py with the Hopper backward's tail_pairs (common/scheduler.cuh) raised to at least $TAIL pairs
wherever the host sets one (a block mask with its key order): the A/B of session 52's tail rule
(bench/NOTES.md). Run from the repository root: TAIL=8 python bench/runs/2026-12-07-s52/tail_run.py ARGS."""
import os
import runpy
import sys

sys.path.insert(0, os.path.join(os.getcwd(), "bench"))
import cupyflash._families.sm90 as sm90  # noqa: E402

TAIL = int(os.environ.get("TAIL", "0"))
_original = sm90.bwd_tail_pairs


def _raised(p, key_tiles, deterministic, sm_count, tailed):
    tail = _original(p, key_tiles, deterministic, sm_count, tailed)
    return min(p.batch * p.heads_k, max(tail, TAIL)) if tail else 0


sm90.bwd_tail_pairs = _raised
sys.argv = ["bench/mods.py", *sys.argv[1:]]
runpy.run_path("bench/mods.py", run_name="__main__")
