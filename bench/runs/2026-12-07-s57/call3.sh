# Session 57, call 3 (~240 s of device time left): issue 26's V in one box a page
# (pending/i26_values_one_box.patch on HEAD, /tmp/V) against HEAD (/tmp/A): the one forward variant
# compiled in both trees at once, then paged16_ab.py A V A V (dense, pages of 16 and 64, random order),
# then V's paged prefill tests while time allows. Prediction (session 56's box-count model): pages of 16
# from ~0.74x dense to ~0.82x; 64 +0-1%; dense unchanged.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }; L=${LIMIT:-230}; R=$PWD; S=$R/bench/runs/2026-12-07-s57
for t in A V; do rm -rf /tmp/$t && mkdir -p /tmp/$t && git archive HEAD cupyflash kernels_cu bench tests setup.cfg README.md | tar -x -C /tmp/$t; done
(cd /tmp/V && git apply $S/pending/i26_values_one_box.patch) || exit 1
for t in A V; do (cd /tmp/$t && PYTHONPATH=/tmp/$t python $S/paged16_ab.py --precompile) & done; wait
echo "compiled at $(el) s"
for round in 1 2; do for t in A V; do
  [ $(( L - $(el) )) -gt 20 ] || break 2
  echo "$t: $(cd /tmp/$t && PYTHONPATH=/tmp/$t timeout 40 python $S/paged16_ab.py 2>&1 | tail -1) at $(el) s"
done; done
(cd /tmp/V && PYTHONPATH=/tmp/V timeout $(( L - $(el) )) python -m pytest -q -m gpu -n 5 -p no:cacheprovider tests/test_kvcache.py -k paged_prefill 2>&1 | tail -1)
echo "done at $(el) s"
