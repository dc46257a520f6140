# Session 40: run only on an H200 (exits at once on another card). MLA v2 at 128 and 16 heads (pools:
# all pages from DRAM, 256 L2-resident), decode rows of `both`, then `both` (main + the Hopper MLA
# kernel v2 + the per-warp decode) precompiled and its whole GPU suite. Carry [".ab/t"].
export PYTHONUNBUFFERED=1
R=$PWD
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$name"
case "$name" in *H200*) ;; *) echo "not an H200: nothing run"; exit 0;; esac
t0=$(date +%s)
cd .ab/t/both && export PYTHONPATH=$PWD
for h in 128 16; do timeout 60 python $R/bench/runs/2026-12-06-s40/mla_pool.py $h all 256 all; done
timeout 90 python bench/decode.py --quick --rows decode fp8 > $OUT/decode_both.txt 2>&1
grep -iE " x |e4m3" $OUT/decode_both.txt | cut -c1-160 | head -8
echo "timings done at $(( $(date +%s) - t0 )) s"
python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
timeout $(( 590 - ($(date +%s) - t0) )) python -m pytest -v -m gpu -n 16 --dist load -p no:cacheprovider tests > $OUT/suite.txt 2>&1
echo "suite rc=$? at $(( $(date +%s) - t0 )) s"; tail -1 $OUT/suite.txt; grep -E "FAILED|ERROR " $OUT/suite.txt | cut -c1-220 | head -20
