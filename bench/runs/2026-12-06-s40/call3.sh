# Session 40, call 3 (~300 s): (1) MLA v2 with the block table drawn from page pools (all: 604 MB from
# DRAM; 1024: 75 MB; 256: 19 MB, L2-resident) at 128 and 16 heads: how much of the time DRAM costs.
# (2) issue 22's float32 table on main's kernels. (3) ncu of the 16-head row (v2), the memory section.
export PYTHONUNBUFFERED=1
R=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
cd .ab/t/v2 && export PYTHONPATH=$PWD
for h in 128 16; do timeout 60 python $R/bench/runs/2026-12-06-s40/mla_pool.py $h all 1024 256 all; done
echo "pools done at $(( $(date +%s) - t0 )) s"
timeout 240 python bench/bench.py --dtypes fp32 --headdims 64,128 --causal 0,1 --seqlens 1024,4096 --out $OUT/fp32 > $OUT/fp32.txt 2>&1
echo "fp32 rc=$? at $(( $(date +%s) - t0 )) s"; grep -E "^\|" $OUT/fp32.txt | cut -c1-200 | head -24
timeout 90 /usr/local/cuda/bin/ncu -k regex:kvc_mla_sm90 -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
  python $R/bench/runs/2026-12-06-s40/mla_pool.py 16 all > $OUT/ncu16.txt 2>&1
echo "ncu rc=$? at $(( $(date +%s) - t0 )) s"; grep -E "Throughput|Busy|Stall|Hit Rate|Duration|Bandwidth" $OUT/ncu16.txt | head -30
