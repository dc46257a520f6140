# Session 29, call 2 (after call 1 on the same warm machine): issue 26's decode and paged-prefill rows (the
# KV-cache general path now planned, the paged producer warp-parallel), issue 22's tf32 rows both ways,
# issue 23's training costs, and an ncu profile of the dropout forward against the plain one.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
timeout 120 python bench/decode.py --quick --json $OUT/decode.json > $OUT/decode.txt 2>&1; echo "decode rc=$?"; tail -24 $OUT/decode.txt
for mode in "" "--per-call"; do
  timeout 90 python bench/bench.py --dtypes fp32 --headdims 64,128 --causal 0,1 --seqlens 1024,4096 --precision tf32 \
    --no-backward $mode --out $OUT/tf32$mode > $OUT/tf32$mode.txt 2>&1; echo "tf32 $mode rc=$?"; grep -E "^\|" $OUT/tf32$mode.txt | tail -12
done
timeout 90 python bench/training.py --seqlens 4096 --repeats 10 > $OUT/training.txt 2>&1; echo "training rc=$?"; tail -14 $OUT/training.txt
timeout 90 ncu --clock-control none -k regex:sm90_fwd --section SpeedOfLight --section ComputeWorkloadAnalysis \
  --section WarpStateStats --section InstructionStats python bench/runs/2026-12-05-s29/dropout_ncu.py > $OUT/ncu_dropout.txt 2>&1
echo "ncu rc=$?"; grep -E "sm90_fwd|Issue Slots Busy|Executed Ipc Active|Compute \(SM\) Throughput|Duration|Stall|Issued Warp" $OUT/ncu_dropout.txt | head -40
