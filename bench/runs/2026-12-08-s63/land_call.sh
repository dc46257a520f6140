# Session 63: session 62's landing call (never run; its file removed, this replaces it), on the same tree (the
# pairs' three stages and D3 applied, as below); PREP2 compiles s63's call2.sh copies. Session 62's header:
# The landing call of the pairs' three stages and the D3 refactor (written in session 62, never run there: no
# device came). On an H200, with the working tree = main + s60's pending/i26_pairs_three_stages.patch + s62's
# pending/d3_mbarrier_wait_scope.patch (SASS bitwise main's) applied uncommitted (`git apply` both first): s59's landing call (precompile, whole GPU suite, sanitizers of sanitize_kvcache.py), with
# /tmp/A = the same tree with the patch reversed (main) for the racecheck comparison and the paged A/B; then
# paged16_ab.py three rounds on both trees (pages of 16, 32 and 64) while LIMIT allows. PREP2=1: call2.sh's
# copies compiled beside all this (then `bash call2.sh` on the same warm machine starts at once).
export PYTHONUNBUFFERED=1; R=$PWD; P=$R/bench/runs/2026-12-07-s60/pending/i26_pairs_three_stages.patch
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
git apply --check -R $P 2>/dev/null || echo "WARNING: the pairs patch is not applied in this tree"
git apply --check -R $R/bench/runs/2026-12-07-s62/pending/d3_mbarrier_wait_scope.patch 2>/dev/null || echo "WARNING: D3 is not applied in this tree"
rm -rf /tmp/A && mkdir -p /tmp/A && cp -r cupyflash kernels_cu tests bench setup.cfg /tmp/A && (cd /tmp/A && git apply -R $P) || echo "A: reversing the patch failed"
(cd /tmp/A && PYTHONPATH=/tmp/A python -c "
from cupyflash import _kernels
from cupyflash._families import sm90
_kernels.precompile([v for v in sm90.FWD_PAIRS.variants() if v.dtype == 'bfloat16'], max_workers=1)" > /tmp/A_pre.txt 2>&1) &
[ -n "$PREP2" ] && { bash bench/runs/2026-12-08-s63/call2.sh prep > /tmp/call2_prep.txt 2>&1 & }
[ -n "$PREP3" ] && { bash bench/runs/2026-12-08-s64/call3.sh prep > /tmp/call3_prep.txt 2>&1 & }  # session 64
LIMIT=${LAND_LIMIT:-470} bash bench/runs/2026-12-07-s59/land_call.sh
wait
L=${LIMIT:-575}
for round in 1 2 3; do for t in $R /tmp/A; do
  [ $(( L - $(el) )) -gt 45 ] && echo "$([ $t = $R ] && echo S3 || echo main) paged: $(cd $t && PYTHONPATH=$t timeout 40 python $R/bench/runs/2026-12-07-s57/paged16_ab.py --pages 16,32,64 2>&1 | tail -1) at $(el) s"
done; done
echo "call done at $(el) s"
