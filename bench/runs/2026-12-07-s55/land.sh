# Session 55's landing call, any Hopper card (the card is printed and named in the note): the working
# tree (tree hash printed; 1c3b373390a2f0b8 = session 54's T2: the s53 landing, walk ranges, dQ claims).
# Precompile, the GPU suite, memcheck of sanitize_attention.py sm90, racecheck of sm90:bfloat16, then while
# LIMIT (seconds, default 560) allows bench/mods.py's document and ragged rows beside FlexAttention, calls
# back to back and each alone.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }; L=${LIMIT:-560}
echo "tree hash: $(ls -d cupyflash kernels_cu tests README.md | xargs -I{} find {} -type f -not -name '*.pyc' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16)"
export PYTHONPATH=$PWD
python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
timeout $(( L - 150 - $(el) )) python -m pytest -q -m gpu -n 16 --dist load -p no:cacheprovider tests > $OUT/suite.txt 2>&1
echo "suite rc=$? at $(el) s"; tail -1 $OUT/suite.txt; grep -E "FAILED|ERROR " $OUT/suite.txt | cut -c1-220 | head -20
timeout 60 /usr/local/cuda/bin/compute-sanitizer --tool memcheck python tests/sanitize_attention.py sm90 2>&1 | tail -1
timeout 60 /usr/local/cuda/bin/compute-sanitizer --tool racecheck python tests/sanitize_attention.py sm90:bfloat16 2>&1 | grep -E "RACECHECK SUMMARY|ERROR SUMMARY" | tail -1
echo "sanitizers done at $(el) s"
[ $(( L - $(el) )) -gt 60 ] && timeout $(( L - $(el) )) python bench/mods.py --rows document,ragged --out $OUT/mods 2>&1 | tail -6
[ $(( L - $(el) )) -gt 30 ] && timeout $(( L - $(el) )) python bench/mods.py --rows document,ragged --per-call --out $OUT/mods_pc 2>&1 | tail -6
echo "done at $(el) s"
