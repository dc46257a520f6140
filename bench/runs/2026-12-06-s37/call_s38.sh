# Session 38's first call (~500 s). Build first, on the CPU:
#   rm -rf .ab/t && mkdir -p .ab/t/mla && git archive HEAD cupyflash kernels_cu bench tests README.md ARCHITECTURE.md \
#     | tar -x -C .ab/t/mla && (cd .ab/t/mla && patch -p1 -s < ../../../bench/runs/2026-12-06-s37/pending/i26_mla_sm90.patch)
# and pass carry=[".ab/t"]. The Hopper MLA kernel (.ab/t/mla): memcheck and racecheck of the KV-cache
# kernels, its GPU tests, its rows; then main's MLA rows (the 16-head timing question of session 37).
export PYTHONUNBUFFERED=1
R=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
LIMIT=${LIMIT:-500}
left() { echo $(( LIMIT - ($(date +%s) - t0) )); }
cd .ab/t/mla
PYTHONPATH=$PWD python -c "
from cupyflash import _kernels
from cupyflash._kvcache import device
_kernels.precompile([v for k in device.KERNELS for v in k.variants()], max_workers=16)"
echo "precompile at $(( $(date +%s) - t0 )) s"
PYTHONPATH=$PWD timeout 110 compute-sanitizer --tool memcheck --error-exitcode 1 python tests/sanitize_kvcache.py > $OUT/memcheck_mla.txt 2>&1; echo "memcheck rc=$? at $(( $(date +%s) - t0 )) s"; tail -3 $OUT/memcheck_mla.txt
PYTHONPATH=$PWD timeout 120 compute-sanitizer --tool racecheck --error-exitcode 1 python tests/sanitize_kvcache.py > $OUT/racecheck_mla.txt 2>&1; echo "racecheck rc=$? at $(( $(date +%s) - t0 )) s"; tail -3 $OUT/racecheck_mla.txt
PYTHONPATH=$PWD timeout $(( $(left) - 90 )) python -m pytest -q -p no:cacheprovider -p no:xdist tests/test_kvcache.py -k mla > $OUT/mla_tests.txt 2>&1; echo "mla tests rc=$? at $(( $(date +%s) - t0 )) s"; tail -2 $OUT/mla_tests.txt; grep -E "^E |FAILED" $OUT/mla_tests.txt | cut -c1-200 | head
PYTHONPATH=$PWD timeout 40 python bench/decode.py --quick --rows mla > $OUT/mla_rows.txt 2>&1; tail -5 $OUT/mla_rows.txt | cut -c1-160
cd $R && PYTHONPATH=$R timeout $(( $(left) - 3 )) python bench/decode.py --quick --rows mla > $OUT/mla_rows_main.txt 2>&1; tail -5 $OUT/mla_rows_main.txt | cut -c1-160
echo "end at $(( $(date +%s) - t0 )) s"
