# Session 58's second call (same warm machine as land_s58.sh, same working tree): racecheck of
# sanitize_kvcache.py (main: 131 hazards, the known mbarrier hand-offs) and of sm90:float8_e4m3fn (main: 2
# reports, 16 and 64 hazards), then A/B rounds against HEAD (/tmp/A): paged16_ab.py (session 57, H100,
# random pages: pages of 16 HEAD 472/470, V 501/493; dense 598-604; 64 587/579 against 592/592) and
# bench/fp8.py's 16k rows, A B A B, then bench/ab.py's dense forward rows, while LIMIT (default 420 s) allows.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }; L=${LIMIT:-420}; R=$PWD; CS=/usr/local/cuda/bin/compute-sanitizer
S=$R/bench/runs/2026-12-07-s57
echo "kvcache racecheck: $(PYTHONPATH=$R timeout 50 $CS --tool racecheck python tests/sanitize_kvcache.py 2>&1 | grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' | tail -1)"
echo "FP8 racecheck: $(PYTHONPATH=$R timeout 70 $CS --tool racecheck python tests/sanitize_attention.py sm90:float8_e4m3fn 2>&1 | grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' | tail -1)"
rm -rf /tmp/A && mkdir -p /tmp/A && git archive HEAD cupyflash kernels_cu bench tests setup.cfg README.md | tar -x -C /tmp/A
(cd /tmp/A && PYTHONPATH=/tmp/A python $S/paged16_ab.py --precompile)
for round in 1 2; do for t in /tmp/A $R; do
  [ $(( L - $(el) )) -gt 50 ] || break 2
  echo "$t paged: $(cd $t && PYTHONPATH=$t timeout 40 python $S/paged16_ab.py 2>&1 | tail -1) at $(el) s"
  (cd $t && PYTHONPATH=$t timeout 60 python bench/fp8.py --headdims 64,128,256 --seqlens 16384 2>&1 | tail -7)
done; done
# The dense forward reads V's descriptor offsets at run time now (Sm90FwdState::v_rows): its rows, HEAD
# against this tree, while time allows.
[ $(( L - $(el) )) -gt 90 ] && timeout $(( L - $(el) )) python bench/ab.py --old /tmp/A --new $R \
  --rows 'fwd_d128,fwd_d128_causal,fwd_d256,fwd_d128_s16k,fwd_gqa' --rounds 2 2>&1 | tail -8
echo "done at $(el) s"
