"""Whether two trees build the same machine code: every sm_90a variant (kernels of arch 90a or under sm90/)
compiled offline with NVRTC (no GPU), eight variants a program, each program's cubin disassembled with
nvdisasm (the test extras' copy: put .../site-packages/nvidia/cu13/bin on PATH); prints a SASS hash per
program. Run once per tree and diff the outputs; session 62 landed the D3 refactor of
kernels_cu/sm90/primitives.cuh on equal hashes for all 216 variants (30 programs, ~9 min on two cores).
PYTHONPATH=<tree> python sass_same.py <tag>   (writes /tmp/sass_<tag>/NNN.sass)"""
import collections
import hashlib
import os
import subprocess
import sys

from cupyflash import _families, _kernels

tag = sys.argv[1]
os.makedirs(f"/tmp/sass_{tag}", exist_ok=True)
groups = collections.defaultdict(list)
for v in _families.VARIANTS:
    if v.kernel.arch == "90a" or "sm90" in v.kernel.source_file:
        groups[v.source].append(v)
chunks = [vs[i:i + 8] for vs in groups.values() for i in range(0, len(vs), 8)]
for n, vs in enumerate(chunks):
    cubin, _, _ = _kernels.compile_offline(vs, "90")
    path = f"/tmp/sass_{tag}/{n:03d}"
    with open(path + ".cubin", "wb") as f:
        f.write(cubin)
    sass = subprocess.run(["nvdisasm", "-c", path + ".cubin"], capture_output=True, text=True, check=True).stdout
    with open(path + ".sass", "w") as f:
        f.write(sass)
    print(n, vs[0].kernel.name, len(vs), hashlib.sha256(sass.encode()).hexdigest()[:16], flush=True)
