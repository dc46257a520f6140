# Session 60's first call for the paired paged prefill (working tree = main +
# pending/i26_pairs_small_pages.patch): the sanitizers the s59 landing call had no time for (racecheck of
# sanitize_kvcache.py, whose paired prefill is the new kernel's only racecheck; memcheck of
# sanitize_attention.py sm90:bfloat16, the unpaired forwards' scheduler and state changed shape), the
# paired GPU tests alone, then paged16_ab.py A / tree with pages of 32 added (the policy pairs 16 and 32,
# only 16 is measured). Any Hopper card, ~320 s. Then land_call.sh (the whole suite, ~420 s) on the same
# warm machine.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }; R=$PWD; CS=/usr/local/cuda/bin/compute-sanitizer
S=$R/bench/runs/2026-12-07-s57
rm -rf /tmp/A && mkdir -p /tmp/A && git archive HEAD cupyflash kernels_cu bench tests setup.cfg README.md | tar -x -C /tmp/A
(cd /tmp/A && PYTHONPATH=/tmp/A python $S/paged16_ab.py --precompile) &
PYTHONPATH=$R python -c "
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=15)"  # (the sanitizers' kernels too; land_call.sh's then hit the cache)
wait; echo "compiled at $(el) s"
echo "kvcache racecheck: $(PYTHONPATH=$R timeout 80 $CS --tool racecheck python tests/sanitize_kvcache.py 2>&1 | grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' | tail -1) at $(el) s"
echo "kvcache memcheck: $(PYTHONPATH=$R timeout 40 $CS --tool memcheck python tests/sanitize_kvcache.py 2>&1 | tail -1) at $(el) s"
PYTHONPATH=$R timeout 60 python -m pytest -q -p no:cacheprovider -m gpu tests/test_kvcache.py -k clusters > /tmp/pairs.txt 2>&1
echo "paired tests rc=$? at $(el) s: $(tail -1 /tmp/pairs.txt)"
for round in 1 2 3; do for t in /tmp/A $R; do
  echo "$(basename $t) paged: $(cd $t && PYTHONPATH=$t timeout 40 python $S/paged16_ab.py --pages 16,32,64 2>&1 | tail -1) at $(el) s"
done; done
echo "sm90:bfloat16 memcheck: $(PYTHONPATH=$R timeout 120 $CS --tool memcheck python tests/sanitize_attention.py sm90:bfloat16 2>&1 | tail -1) at $(el) s"
echo "done at $(el) s"
