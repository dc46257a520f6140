# Session 40, call 4: on an H200, call_h200.sh (MLA and decode rows, the whole suite of `both`); on
# another card, ncu of the dense decode step 1 x 131072 (GQA 32/8, d128) by cupyflash and by cuDNN.
export PYTHONUNBUFFERED=1
R=$PWD
case "$(nvidia-smi --query-gpu=name --format=csv,noheader)" in *H200*) exec bash bench/runs/2026-12-06-s40/call_h200.sh;; esac
nvidia-smi --query-gpu=name --format=csv,noheader
cd .ab/t/both && export PYTHONPATH=$PWD
S="--section SpeedOfLight --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section SchedulerStats"
timeout 100 /usr/local/cuda/bin/ncu $S -k regex:kvc -c 4 python $R/bench/runs/2026-12-06-s40/decode_ncu.py flash > $OUT/ncu_flash.txt 2>&1; echo "flash rc=$?"
timeout 100 /usr/local/cuda/bin/ncu $S -k regex:"sdpa|fmha|cudnn|flash|attention" -c 4 python $R/bench/runs/2026-12-06-s40/decode_ncu.py cudnn > $OUT/ncu_cudnn.txt 2>&1; echo "cudnn rc=$?"
for f in flash cudnn; do echo "== $f"; grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Grid Size|Block Size|Registers Per|Achieved Occupancy|L2 Hit Rate|Dynamic Shared|Waves Per SM" $OUT/ncu_$f.txt | cut -c1-150 | head -40; done
