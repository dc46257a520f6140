# Session 32, call E: the final dropout tree (8-bit draws, applied after the softmax): its tests, the
# training rows, memcheck and racecheck; then issue 22's float32 backward (d128 causal 4k) under ncu's
# full set with per-instruction stall samples, for the next session.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
S=bench/runs/2026-12-05-s32
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
timeout 120 python -m pytest -q -m gpu -n 8 -p no:cacheprovider -rfE tests/test_gpu_training.py tests/test_training.py 2>&1 | tail -2
timeout 70 python bench/training.py --seqlens 4096 --repeats 20 2>&1 | tee $OUT/training.txt
timeout 40 python $S/fwd_times.py
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 1 python $S/sanitize_dropout.py > $OUT/memcheck_dropout.txt 2>&1; echo "memcheck rc=$?"; tail -1 $OUT/memcheck_dropout.txt
timeout 90 compute-sanitizer --tool racecheck --error-exitcode 1 python $S/sanitize_dropout.py > $OUT/racecheck_dropout.txt 2>&1; echo "racecheck rc=$?"; tail -1 $OUT/racecheck_dropout.txt
echo "ncu at $(( $(date +%s) - t0 )) s"
timeout 150 ncu --clock-control none --kernel-name regex:sm90_bwd_planes --launch-skip 1 --launch-count 1 --set full \
  --import-source no -o $OUT/bwd32_d128 python $S/onebwd32.py 4 4096 128 1 > $OUT/ncu_bwd32.txt 2>&1; tail -2 $OUT/ncu_bwd32.txt
timeout 60 ncu -i $OUT/bwd32_d128.ncu-rep --page details > $OUT/bwd32_details.txt 2>&1
timeout 60 ncu -i $OUT/bwd32_d128.ncu-rep --page source --print-source sass --csv > $OUT/bwd32_sass.csv 2>&1
gzip -f $OUT/bwd32_sass.csv; ls -la $OUT
grep -E "Duration|Issue Slots Busy|No Eligible|Stall" $OUT/bwd32_details.txt | head -12
echo "end at $(( $(date +%s) - t0 )) s"
