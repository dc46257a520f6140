export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
t0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
timeout 100 python -m pytest -v -m gpu -n 8 --dist load -p no:cacheprovider tests/test_gpu_mods.py > $OUT/mods_tests.txt 2>&1
echo "mods tests rc=$?"; tail -1 $OUT/mods_tests.txt; grep -E "FAILED|ERROR " $OUT/mods_tests.txt | head
echo "at $(( $(date +%s) - t0 )) s"
(cd .ab/t/base && PYTHONPATH=$PWD timeout 60 python bench/mods.py --rows alibi,relbias --no-peers --out $OUT/base > $OUT/mods_base.txt 2>&1)
timeout 60 python bench/mods.py --rows alibi,relbias --no-peers --out $OUT/new > $OUT/mods_new.txt 2>&1
grep -E "^(alibi|relbias)" $OUT/mods_base.txt $OUT/mods_new.txt
echo "end at $(( $(date +%s) - t0 )) s"
