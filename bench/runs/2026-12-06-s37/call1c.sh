# Session 37, call 1: main + the four pending patches (root): precompile, the whole GPU suite; the Hopper
# MLA kernel in its own tree (.ab/t/mla: root + pending/i26_mla_sm90.patch): its tests, then its rows;
# split_keys (.ab/t/split): its bitwise check and speed; each step only while time is left.
export PYTHONUNBUFFERED=1
R=$PWD
P=$R/bench/runs/2026-12-05-s33/pre.py
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
LIMIT=${LIMIT:-585}
left() { echo $(( LIMIT - ($(date +%s) - t0) )); }
PYTHONPATH=$R python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
(cd .ab/t/mla && PYTHONPATH=$PWD timeout 90 python -c "
from cupyflash import _kernels
from cupyflash._kvcache import device
_kernels.precompile(device.MLA_SM90.variants() + device.MLA.variants(), max_workers=4)" > $OUT/mla_pre.txt 2>&1) &
PYTHONPATH=$R timeout $(( $(left) - 230 < 290 ? $(left) - 230 : 290 )) python -m pytest -v -m gpu -n 16 --dist load -p no:cacheprovider tests > $OUT/suite.txt 2>&1
echo "suite rc=$? at $(( $(date +%s) - t0 )) s"; tail -1 $OUT/suite.txt; grep -E "FAILED|ERROR " $OUT/suite.txt | cut -c1-220 | head -20
wait
(cd .ab/t/split && PYTHONPATH=$PWD timeout 60 python $P fp32 16 > /dev/null) &
(cd .ab/t/mla && PYTHONPATH=$PWD timeout 80 python -m pytest -q -p no:cacheprovider -n 4 tests/test_kvcache.py -k "mla" > $OUT/mla_tests.txt 2>&1); echo "mla tests rc=$? at $(( $(date +%s) - t0 )) s"; tail -3 $OUT/mla_tests.txt; grep -E "^E |FAILED" $OUT/mla_tests.txt | cut -c1-200 | head -12
(cd .ab/t/mla && PYTHONPATH=$PWD timeout 70 python bench/decode.py --quick --rows mla > $OUT/mla_rows.txt 2>&1); echo "mla rows rc=$?"; tail -6 $OUT/mla_rows.txt | cut -c1-160
wait
(cd .ab/t/split && PYTHONPATH=$PWD timeout $(( $(left) - 5 )) python $R/bench/runs/2026-12-05-s36/split_check.py > $OUT/split_check.txt 2>&1); echo "split rc=$? at $(( $(date +%s) - t0 )) s"; tail -22 $OUT/split_check.txt
echo "end at $(( $(date +%s) - t0 )) s"
