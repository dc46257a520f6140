# Session 33, call 3: host time of dropout calls (per call 2.3-3.3x plain in call 1); split_planes'
# speed at 16 x 1k x 16 x 128 float32 (82 us a pass in session 21: 1 TB/s).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
S=bench/runs/2026-12-05-s33
python $S/pre.py drop 16; python $S/pre.py fp32 16
timeout 90 python $S/host_dropout.py 2>&1 | head -40
timeout 120 ncu --kernel-name regex:"split_planes|sm90_fwd_planes|sm90_bwd_planes|bwd_delta|dq_convert" --launch-skip 0 --launch-count 12 \
  --section SpeedOfLight python $S/prepass_ncu.py > $OUT/ncu_prepass.txt 2>&1
grep -E "split_planes|sm90_|bwd_|Duration|DRAM Throughput|Memory Throughput" $OUT/ncu_prepass.txt | head -60
