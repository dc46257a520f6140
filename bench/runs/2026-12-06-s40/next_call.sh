# Session 41's first call (~560 s). Build first, on the CPU:
#   rm -rf .ab/t && mkdir -p .ab/t/both
#   git archive HEAD cupyflash kernels_cu bench tests tools README.md ARCHITECTURE.md | tar -x -C .ab/t/both; rm -rf .ab/t/both/bench/runs
#   P=../../../bench/runs; (cd .ab/t/both && patch -p1 -s < $P/2026-12-06-s39/pending/i26_mla_sm90_v2.patch && patch -p1 -s < $P/2026-12-06-s39/pending/i25_decode_per_warp.patch)
#   (cd .ab/t/both && patch -p1 -s < ../../../bench/runs/2026-12-06-s40/pending/forced_family_fp8_error.patch)
#   cp -r .ab/t/both .ab/t/l256 && (cd .ab/t/l256 && patch -p1 -s < ../../../bench/runs/2026-12-06-s40/pending/i26_decode_cp_async_l2_256.patch)
# and pass carry [".ab/t"], kind nvidia-h200. `both` = main + the Hopper MLA kernel (v2) + the per-warp
# decode (dW) + the forced family's FP8 error (dispatch; on landing, README's CUPYFLASH_FAMILY sentence
# says NotImplementedError again). v2 + dW passed the whole suite on an H100 in session 40 (914 passed),
# memcheck 0, racecheck of the decode kernels 0. On an H200: the issue rows first (decode beside cuDNN, e4m3, MLA at 128 and 16
# heads), the L2-hint A/B, then the whole suite of `both`; land `both` if it passes. On an H100: the
# rows, the A/B and the L2 metrics of the decode kernels only (the suite ran there already).
export PYTHONUNBUFFERED=1
R=$PWD; S=$R/bench/runs/2026-12-06-s40
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$name"
t0=$(date +%s)
for t in both l256 l256 both; do (cd .ab/t/$t && PYTHONPATH=$PWD timeout 60 python $S/decode_ab.py $t 2>&1 | tail -1); done
cd .ab/t/both && export PYTHONPATH=$PWD
for h in 128 16; do timeout 60 python $S/mla_pool.py $h all 256; done
timeout 90 python bench/decode.py --quick --rows fp8 2>&1 | grep -i e4m3
bash $S/decode_l2_metrics.sh
echo "rows done at $(( $(date +%s) - t0 )) s"
case "$name" in *H200*) ;; *) exit 0;; esac
python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
timeout $(( 590 - ($(date +%s) - t0) )) python -m pytest -v -m gpu -n 16 --dist load -p no:cacheprovider tests > $OUT/suite.txt 2>&1
echo "suite rc=$? at $(( $(date +%s) - t0 )) s"; tail -1 $OUT/suite.txt; grep -E "FAILED|ERROR " $OUT/suite.txt | cut -c1-220 | head -20
