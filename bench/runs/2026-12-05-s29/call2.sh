# Session 29, call 2: the rows that decide issue 22's tf32 target and issue 26's paged prefill, both timings,
# with peers (the H200 if lent), and the training features' costs.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
for mode in "" "--per-call"; do
  timeout 150 python bench/bench.py --dtypes fp32 --headdims 64,128 --causal 0,1 --seqlens 1024,4096 --precision tf32 \
    --no-backward $mode --out $OUT/tf32$mode > $OUT/tf32$mode.txt 2>&1; echo "tf32 $mode rc=$?"; grep -E "^\|" $OUT/tf32$mode.txt | tail -12
done
timeout 150 python bench/decode.py --quick --json $OUT/decode.json > $OUT/decode.txt 2>&1; echo "decode rc=$?"; tail -24 $OUT/decode.txt
timeout 100 python bench/training.py --seqlens 4096 --repeats 10 > $OUT/training.txt 2>&1; echo "training rc=$?"; tail -14 $OUT/training.txt
