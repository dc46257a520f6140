# Session 37, call 1 as the budget fell (~480 s): main + the four pending patches (root): precompile, the
# whole GPU suite; then the Hopper MLA kernel in its own tree (.ab/t/mla: root + pending/i26_mla_sm90.patch):
# its tests, then its rows. split_keys' check waits for a later call.
export PYTHONUNBUFFERED=1
R=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
LIMIT=${LIMIT:-480}
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
S=$(( $(left) - 125 )); S=$(( S < 300 ? S : 300 ))
PYTHONPATH=$R timeout $S python -m pytest -v -m gpu -n 16 --dist load -p no:cacheprovider tests > $OUT/suite.txt 2>&1
echo "suite rc=$? at $(( $(date +%s) - t0 )) s (limit $S)"; tail -1 $OUT/suite.txt; grep -c PASSED $OUT/suite.txt; grep -E "FAILED|ERROR " $OUT/suite.txt | cut -c1-220 | head -20
wait
(cd .ab/t/mla && PYTHONPATH=$PWD timeout 70 python -m pytest -q -p no:cacheprovider -n 4 tests/test_kvcache.py -k "mla" > $OUT/mla_tests.txt 2>&1); echo "mla tests rc=$? at $(( $(date +%s) - t0 )) s"; tail -3 $OUT/mla_tests.txt; grep -E "^E |FAILED" $OUT/mla_tests.txt | cut -c1-200 | head -12
(cd .ab/t/mla && PYTHONPATH=$PWD timeout $(( $(left) - 3 )) python bench/decode.py --quick --rows mla > $OUT/mla_rows.txt 2>&1); echo "mla rows rc=$?"; tail -6 $OUT/mla_rows.txt | cut -c1-160
echo "end at $(( $(date +%s) - t0 )) s"
