# Session 41, call 2 (~300 s, any Hopper): issue 25's FP8 forward under ncu (pipes, issue, stalls;
# fp8_ncu.sh), then issue 26's decode: the L1/L2 request tables of kvc_fwd and of cuDNN's kernel (why
# ours reads 25.2M L2 sectors where cuDNN reads 16.8M for the same 537 MB from DRAM), the L2 metrics with
# the 128- and 256-byte L2 hints, and decode_ab.py of both / l128 / l256 in two rounds.
# Trees: .ab/t/both (main + v2 + dW + forced family), l256 (+ s40's L2::256B patch), l128 (the same with 128B).
export PYTHONUNBUFFERED=1
R=$PWD; S4=$R/bench/runs/2026-12-06-s40; S=$R/bench/runs/2026-12-06-s41
nvidia-smi --query-gpu=name --format=csv,noheader; t0=$(date +%s)
PYTHONPATH=$R bash $S/fp8_ncu.sh
echo "fp8 ncu done at $(( $(date +%s) - t0 )) s"
cd $R/.ab/t/both
PYTHONPATH=$PWD timeout 60 /usr/local/cuda/bin/ncu --section MemoryWorkloadAnalysis_Tables -k regex:kvc_fwd -c 1 python $S4/decode_ncu.py flash > $OUT/mwa_ours.txt 2>&1
PYTHONPATH=$PWD timeout 60 /usr/local/cuda/bin/ncu --section MemoryWorkloadAnalysis_Tables -k regex:"sdpa|fmha|cudnn" -c 1 python $S4/decode_ncu.py cudnn > $OUT/mwa_cudnn.txt 2>&1
grep -iE "sector|request|ldgsts|global" $OUT/mwa_ours.txt | head -20; echo ---; grep -iE "sector|request|ldgsts|global" $OUT/mwa_cudnn.txt | head -20
M='regex:^lts__t_(sectors|requests)_srcunit_tex(_lookup_hit|_lookup_miss)?\.sum$,dram__bytes_read.sum,gpu__time_duration.sum'
for t in l128 l256; do echo "== $t"; (cd $R/.ab/t/$t && PYTHONPATH=$PWD timeout 60 /usr/local/cuda/bin/ncu --metrics "$M" -k regex:kvc_fwd -c 1 python $S4/decode_ncu.py flash 2>&1 | grep -E "lts__|dram__|gpu__" | cut -c1-130); done
echo "metrics done at $(( $(date +%s) - t0 )) s"
for t in both l128 l256 l256 l128 both; do (cd $R/.ab/t/$t && PYTHONPATH=$PWD timeout 60 python $S4/decode_ab.py $t 2>&1 | tail -1); done
echo "done at $(( $(date +%s) - t0 )) s"
