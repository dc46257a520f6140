# Session 46's landing call (~590 s, either card; no carry): ../2026-12-06-s45/land_all.sh (the five pending
# patches, ord's with its shared memory rounded up to 16 bytes; as run it printed `code hash: 038cb2571f98997c`
# from land_all.sh's old hash line; its new line gives `tree hash: 9fc88cff7312c4cb` here; precompile, the
# whole GPU suite, memcheck of the KV-cache kernels and of every sm90 kernel), then racecheck of the float32
# (sel) and bfloat16 (ord, the score/mask function kernels) sm90 runs while time is left, with the kernels
# its hazard reports name counted (the known false class: the mbarrier stage hand-off, tests/sanitize_mbarrier.py).
export PYTHONUNBUFFERED=1
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
bash bench/runs/2026-12-06-s45/land_all.sh
cs="/usr/local/cuda/bin/compute-sanitizer --error-exitcode 1"
for dt in float32 bfloat16; do
  left=$(( 590 - $(el) )); [ $left -lt 40 ] && break
  PYTHONPATH=$PWD timeout $left $cs --tool racecheck python tests/sanitize_attention.py sm90:$dt > $OUT/racecheck_$dt.txt 2>&1
  echo "racecheck $dt rc=$? at $(el) s"; grep -E "SUMMARY|sanitize_attention: done" $OUT/racecheck_$dt.txt
  grep -oE "at (void )?cupyflash::[A-Za-z_0-9]+" $OUT/racecheck_$dt.txt | sort | uniq -c | sort -rn | head -6
done
