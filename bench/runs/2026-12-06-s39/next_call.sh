# Session 40's first call (~580 s, H100 or H200). Build first, on the CPU:
#   rm -rf .ab/t && mkdir -p .ab/t/v2 .ab/t/both .ab/t/cA .ab/t/cP
#   for t in v2 both cA cP; do git archive HEAD cupyflash kernels_cu bench tests tools README.md ARCHITECTURE.md | tar -x -C .ab/t/$t; rm -rf .ab/t/$t/bench/runs; done
#   P=../../../bench/runs/2026-12-06-s39/pending
#   for t in v2 both cA cP; do (cd .ab/t/$t && patch -p1 -s < $P/i26_mla_sm90_v2.patch); done
#   (cd .ab/t/both && patch -p1 -s < $P/i26_mla_cF_seesaw.patch && patch -p1 -s < $P/i25_decode_per_warp.patch)
#   (cd .ab/t/cA && patch -p1 -s < $P/i26_mla_cA.patch); (cd .ab/t/cP && patch -p1 -s < $P/i26_mla_cP_l2_prefetch.patch)
# (i26_mla_sm90_v2.patch is the Hopper MLA kernel: it passed the whole suite on an H100 in session 39
# and waits for an H200 run; `v2` times it alone and is the baseline "main" below.)
# and pass carry [".ab/t"]. `both` holds the two kernels to land (they change different files, so a
# failing test names its kernel): the MLA seesaw (cF) and the decode kernel with per-warp rows (dW);
# cA and cP are timed only. Steps: MLA times of main, cA, cF, cP in two rounds (the second reversed);
# decode rows (bf16 and e4m3) of main and `both`; then `both` precompiled and its whole GPU suite.
# Land what passes and is faster, after a whole suite on an H200 only; quote the suite line.
export PYTHONUNBUFFERED=1
R=$PWD
T=$R/bench/runs/2026-12-06-s37/mla_time.py
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
LIMIT=${LIMIT:-580}
left() { echo $(( LIMIT - ($(date +%s) - t0) )); }
timeit() { (cd $1 && PYTHONPATH=$PWD timeout 60 python $T 128 16 32 2>&1 | tail -4 > /tmp/time_$2_$3.txt); echo "$2 round $3:"; cat /tmp/time_$2_$3.txt; }
timeit .ab/t/v2 main 1; timeit .ab/t/cA cA 1; timeit .ab/t/both cF 1; timeit .ab/t/cP cP 1
timeit .ab/t/cP cP 2; timeit .ab/t/both cF 2; timeit .ab/t/cA cA 2; timeit .ab/t/v2 main 2
for t in main both; do d=$R/.ab/t/v2; [ $t = both ] && d=$R/.ab/t/both
  (cd $d && PYTHONPATH=$PWD timeout 70 python bench/decode.py --quick --rows decode fp8 > $OUT/decode_$t.txt 2>&1)
  echo "decode $t rc=$?"; grep -iE " x |e4m3" $OUT/decode_$t.txt | cut -c1-160 | head -8
done
echo "timings done at $(( $(date +%s) - t0 )) s"
(cd .ab/t/both && PYTHONPATH=$PWD python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')")
(cd .ab/t/both && PYTHONPATH=$PWD timeout $(( $(left) - 5 )) python -m pytest -v -m gpu -n 16 --dist load -p no:cacheprovider tests > $OUT/suite.txt 2>&1)
echo "suite rc=$? at $(( $(date +%s) - t0 )) s"; tail -1 $OUT/suite.txt; grep -E "FAILED|ERROR " $OUT/suite.txt | cut -c1-220 | head -20
