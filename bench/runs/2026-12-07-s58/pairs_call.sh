# Session 58, issue 26: the paired paged prefill (sm90_fwd_pairs: clusters of two CTAs on two query heads
# of one kv head, each issuing half of every key tile's TMA boxes into both with multicast). Working tree
# = main + pending/i26_pairs.patch (`git apply bench/runs/2026-12-07-s58/pending/i26_pairs.patch` first);
# A = HEAD (git archive). Any Hopper card; ~420 s (LIMIT) plus the start. Order: the decision data first
# (a correctness smoke test under a short timeout: a deadlock shows as rc 124), then paged16_ab.py A / tree
# rounds, then the paged GPU tests, memcheck and racecheck of sanitize_kvcache.py, while LIMIT allows.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }; L=${LIMIT:-420}; R=$PWD; CS=/usr/local/cuda/bin/compute-sanitizer
S=$R/bench/runs/2026-12-07-s57
rm -rf /tmp/A && mkdir -p /tmp/A && git archive HEAD cupyflash kernels_cu bench tests setup.cfg README.md | tar -x -C /tmp/A
(cd /tmp/A && PYTHONPATH=/tmp/A python $S/paged16_ab.py --precompile) &
PYTHONPATH=$R python -c "
from cupyflash import _families, _kernels
from cupyflash._families import sm90
_kernels.precompile([v for v in _families.VARIANTS if v.kernel.name in ('sm90_fwd', 'sm90_fwd_pairs') and v.dtype == 'bfloat16'
                     and v.tile[:2] == (128, 128) and not any(v.flags)] + list(sm90.FWD_PAIRS.variants()), max_workers=3)"
wait; echo "compiled at $(el) s"
PYTHONPATH=$R timeout 90 python -m pytest -q -x -p no:cacheprovider -m gpu tests/test_kvcache.py -k clusters > /tmp/smoke.txt 2>&1
echo "smoke rc=$? at $(el) s"; tail -3 /tmp/smoke.txt
for round in 1 2; do for t in /tmp/A $R; do
  [ $(( L - $(el) )) -gt 40 ] || break 2
  echo "$t paged: $(cd $t && PYTHONPATH=$t timeout 40 python $S/paged16_ab.py 2>&1 | tail -1) at $(el) s"
done; done
[ $(( L - $(el) )) -gt 100 ] && PYTHONPATH=$R timeout $(( L - $(el) - 60 )) python -m pytest -q -p no:cacheprovider -m gpu -n 8 \
  tests/test_kvcache.py tests/test_gpu_sm90.py 2>&1 | tail -3
echo "tests at $(el) s"
[ $(( L - $(el) )) -gt 50 ] && echo "kvcache memcheck: $(PYTHONPATH=$R timeout 50 $CS --tool memcheck python tests/sanitize_kvcache.py 2>&1 | tail -1) at $(el) s"
[ $(( L - $(el) )) -gt 50 ] && echo "kvcache racecheck: $(PYTHONPATH=$R timeout 55 $CS --tool racecheck python tests/sanitize_kvcache.py 2>&1 | grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' | tail -1) at $(el) s"
echo "done at $(el) s"
