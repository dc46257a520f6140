# Session 36, one combined call (starts were scarce): main + the pending patches (root): precompile, the
# whole GPU suite, racecheck of the KV-cache kernels; then split_keys (.ab/t/split): its bitwise check
# and speed against the planes pass; then the MLA rows; each step only while time is left.
export PYTHONUNBUFFERED=1
R=$PWD
P=$R/bench/runs/2026-12-05-s33/pre.py
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
LIMIT=${LIMIT:-590}
left() { echo $(( LIMIT - ($(date +%s) - t0) )); }
PYTHONPATH=$R python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
PYTHONPATH=$R timeout $(( $(left) - 20 < 300 ? $(left) - 20 : 300 )) python -m pytest -v -m gpu -n 16 --dist load -p no:cacheprovider tests > $OUT/suite.txt 2>&1
echo "suite rc=$? at $(( $(date +%s) - t0 )) s"; tail -1 $OUT/suite.txt; grep -E "FAILED|ERROR " $OUT/suite.txt | cut -c1-220 | head -20
(cd .ab/t/split && PYTHONPATH=$PWD timeout 60 python $P fp32 16 > /dev/null) &
PYTHONPATH=$R timeout 100 compute-sanitizer --tool racecheck --error-exitcode 1 python tests/sanitize_kvcache.py > $OUT/racecheck_kvc.txt 2>&1; echo "racecheck kvc rc=$? at $(( $(date +%s) - t0 )) s"; tail -3 $OUT/racecheck_kvc.txt
wait
(cd .ab/t/split && PYTHONPATH=$PWD timeout $(( $(left) - 40 )) python $R/bench/runs/2026-12-05-s36/split_check.py > $OUT/split_check.txt 2>&1); echo "split rc=$? at $(( $(date +%s) - t0 )) s"; tail -22 $OUT/split_check.txt
PYTHONPATH=$R timeout $(( $(left) - 3 )) python bench/decode.py --quick --rows mla > $OUT/decode.txt 2>&1; tail -8 $OUT/decode.txt | cut -c1-160
echo "end at $(( $(date +%s) - t0 )) s"
