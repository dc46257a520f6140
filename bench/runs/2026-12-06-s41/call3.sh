# Session 41, call 3 (~200 s, any Hopper): fp8_ncu.sh (call 2 cut its values off), and the source
# counters of the decode kernel (which instructions send the 6.8M small L2 requests that hit).
export PYTHONUNBUFFERED=1
R=$PWD; S4=$R/bench/runs/2026-12-06-s40; S=$R/bench/runs/2026-12-06-s41
nvidia-smi --query-gpu=name --format=csv,noheader; t0=$(date +%s)
PYTHONPATH=$R bash $S/fp8_ncu.sh
echo "fp8 ncu done at $(( $(date +%s) - t0 )) s"
cd $R/.ab/t/both
PYTHONPATH=$PWD timeout 90 /usr/local/cuda/bin/ncu --section SourceCounters --section MemoryWorkloadAnalysis_Tables --print-details all \
  --import-source no -k regex:kvc_fwd -c 1 python $S4/decode_ncu.py flash > $OUT/decode_src.txt 2>&1
PYTHONPATH=$PWD timeout 90 /usr/local/cuda/bin/ncu --section MemoryWorkloadAnalysis_Tables --print-details all \
  -k regex:"sdpa|fmha|cudnn" -c 1 python $S4/decode_ncu.py cudnn > $OUT/decode_cudnn_mwa.txt 2>&1
wc -l $OUT/*.txt; echo "done at $(( $(date +%s) - t0 )) s"
