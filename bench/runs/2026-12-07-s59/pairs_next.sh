# Session 60's first call for the clustered paged prefill. Working tree R = main +
# pending/i26_pairs_small_pages.patch (apply it first); A = HEAD (git archive); Q = R +
# pending/i26_quads.patch (clusters of four CTAs where the GQA group divides by four: paged16_ab's 32/8
# takes them). Order: the decision data (paged16_ab.py A / R / Q with pages of 16, 32 and 64, three
# rounds), then what R's landing needs beside the suite (racecheck and memcheck of sanitize_kvcache.py,
# the clustered tests, memcheck of sanitize_attention.py sm90:bfloat16), then Q's clustered GPU tests.
# Any Hopper card, ~400 s (LIMIT); then land_call.sh (the whole suite, ~420 s) on the same warm machine.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }; L=${LIMIT:-400}; R=$PWD; CS=/usr/local/cuda/bin/compute-sanitizer
S=$R/bench/runs/2026-12-07-s57
rm -rf /tmp/A /tmp/Q && mkdir -p /tmp/A /tmp/Q
git archive HEAD cupyflash kernels_cu bench tests setup.cfg README.md | tar -x -C /tmp/A
cp -r cupyflash kernels_cu bench tests setup.cfg README.md /tmp/Q && (cd /tmp/Q && git apply $R/bench/runs/2026-12-07-s59/pending/i26_quads.patch) || echo "Q: the patch does not apply"
(cd /tmp/A && PYTHONPATH=/tmp/A python $S/paged16_ab.py --precompile) &
(cd /tmp/Q && PYTHONPATH=/tmp/Q python -c "
from cupyflash import _kernels
from cupyflash._families import sm90
_kernels.precompile(list(sm90.FWD_PAIRS.variants()), max_workers=4)") &
PYTHONPATH=$R python -c "
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=12)"  # (the sanitizers' kernels too; land_call.sh's then hit the cache)
wait; echo "compiled at $(el) s"
for round in 1 2 3; do for t in /tmp/A $R /tmp/Q; do
  echo "$(basename $t) paged: $(cd $t && PYTHONPATH=$t timeout 40 python $S/paged16_ab.py --pages 16,32,64 2>&1 | tail -1) at $(el) s"
done; done
echo "kvcache racecheck: $(PYTHONPATH=$R timeout 80 $CS --tool racecheck python tests/sanitize_kvcache.py 2>&1 | grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' | tail -1) at $(el) s"
echo "kvcache memcheck: $(PYTHONPATH=$R timeout 40 $CS --tool memcheck python tests/sanitize_kvcache.py 2>&1 | tail -1) at $(el) s"
PYTHONPATH=$R timeout 60 python -m pytest -q -p no:cacheprovider -m gpu tests/test_kvcache.py -k clusters > /tmp/pairs.txt 2>&1
echo "R clustered tests rc=$? at $(el) s: $(tail -1 /tmp/pairs.txt)"
[ $(( L - $(el) )) -gt 60 ] && echo "sm90:bfloat16 memcheck: $(PYTHONPATH=$R timeout $(( L - $(el) - 50 )) $CS --tool memcheck python tests/sanitize_attention.py sm90:bfloat16 2>&1 | tail -1) at $(el) s"
[ $(( L - $(el) )) -gt 20 ] && (cd /tmp/Q && PYTHONPATH=/tmp/Q timeout $(( L - $(el) - 5 )) python -m pytest -q -p no:cacheprovider -m gpu tests/test_kvcache.py -k clusters > /tmp/quads.txt 2>&1; echo "Q clustered tests rc=$? at $(el) s: $(tail -1 /tmp/quads.txt)")
echo "done at $(el) s"
