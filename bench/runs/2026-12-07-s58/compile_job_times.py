"""The compile fixture of tests/test_compile.py, job by job on two threads: each job's start, end and length
(seconds), its source file, target and variant count; then the wall and CPU totals. Run from anywhere:
python bench/runs/2026-12-07-s58/compile_job_times.py"""

import concurrent.futures
import itertools
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

import test_compile as tc  # noqa: E402

from cupyflash import _families  # noqa: E402


def group(build):
    variant, arch = build
    return (variant.source_file, arch, variant.kernel.arch or "")


def main():
    builds = sorted(tc._built(_families.VARIANTS, False), key=group)
    groups = [(key[1], [v for v, _ in bs]) for key, bs in itertools.groupby(builds, key=group)]
    jobs = [(vs[i : i + tc._CHUNK], arch) for arch, vs in groups for i in range(0, len(vs), tc._CHUNK)]
    jobs.sort(key=lambda job: -sum(tc._COST.get(v.kernel.name, 1) for v in job[0]))
    t0 = time.time()

    def run(job):
        start = time.time()
        tc._report(*job[:2])
        return start - t0, time.time() - t0, job[0][0].source_file, job[1], len(job[0])

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(run, jobs + tc._user_function_jobs()))
    for start, end, source, arch, count in results:
        print(f"{start:6.1f} {end:6.1f} {end - start:5.1f} {source} sm{arch} n={count}")
    print(f"wall {time.time() - t0:.1f} s, cpu {sum(r[1] - r[0] for r in results):.1f} s")


if __name__ == "__main__":
    main()
