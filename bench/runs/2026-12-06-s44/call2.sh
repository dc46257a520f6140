# Session 44, call 2 (~500 s, either card): session 43's next_call.sh less its racecheck (in call1.sh).
# 2. Where the limiters are, by SASS instruction (ncu --page source, stall samples), for the three rows
#    short of their floors: the FP8 forward d128 16k (session 41's fp8_ncu.py: tensor 48%, XU 50%, "wait"
#    33% of stalls; which chain?), the float32 forward and backward at d128 causal 1k (fp32_parts.py:
#    backward tensor 47.5%, long scoreboard 37%: the producer's lse/delta loads or the consumers' k/v split
#    at each CTA's start?), and paged prefill pages of 16 against dense (paged_ncu.py). The CSVs come back
#    in one tarball; the hot instructions print here (ncu_sass.py from session 16).
# 3. On an H200 only: FP8 rows of main and m192 (d64), forced decode splits (the bytes-in-flight
#    question), decode against cuDNN. m192 lands after the whole suite passes on an H200 (land_call.sh).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$PWD; S=$R/bench/runs/2026-12-06-s43; P=$R/bench/runs/2026-12-04-h200-issue21-s16/ncu_sass.py.txt
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$card"; t0=$(date +%s)
NCU=/usr/local/cuda/bin/ncu; mkdir -p $OUT/csv
src() {  # name, kernel regex, launches, target...
  local name=$1 re=$2 count=$3; shift 3
  timeout 100 $NCU -k regex:"$re" -c $count --section SourceCounters --section WarpStateStats --page source \
    --print-source sass --csv python "$@" > $OUT/csv/$name.csv 2>&1
  echo "== $name rc=$? at $(( $(date +%s) - t0 )) s, $(wc -l < $OUT/csv/$name.csv) lines"
  python $P $OUT/csv/$name.csv hot 25 2>&1 | cut -c1-150
}
src fp32_bwd sm90_bwd_planes 1 bench/runs/2026-12-06-s42/fp32_parts.py
src fp32_fwd sm90_fwd_planes 1 bench/runs/2026-12-06-s42/fp32_parts.py
src fp8_d128 sm90_fwd_fp8 1 bench/runs/2026-12-06-s41/fp8_ncu.py
src paged16 sm90_fwd 1 bench/runs/2026-12-06-s42/paged_ncu.py 16
src dense sm90_fwd 1 bench/runs/2026-12-06-s42/paged_ncu.py 0
(cd $OUT && tar czf ncu_source.tgz csv && rm -rf csv); ls -la $OUT
case "$card" in *H200*)
  echo "== H200 rows at $(( $(date +%s) - t0 )) s"
  timeout 60 python bench/fp8.py --headdims 64,128,256 --seqlens 4096,16384 2>&1 | tail -13 | tee $OUT/fp8_h200.txt
  (cd .ab/t/m192 && PYTHONPATH=$PWD timeout 40 python bench/fp8.py --headdims 64 --seqlens 4096,16384 2>&1 | tail -5 | tee $OUT/fp8_m192_h200.txt)
  timeout 90 python bench/runs/2026-12-06-s40/decode_splits.py 2>&1 | tail -6 | tee $OUT/decode_splits_h200.txt
  timeout 60 python bench/runs/2026-12-06-s40/decode_ab.py main 2>&1 | tail -1 | tee $OUT/decode_ab_h200.txt;;
esac
echo "done at $(( $(date +%s) - t0 )) s"
