export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
P=$PWD/bench/runs/2026-12-05-s33
t0=$(date +%s)
(cd .ab/t/base && PYTHONPATH=$PWD python $P/pre.py drop 16 && PYTHONPATH=$PWD timeout 70 python bench/training.py --seqlens 4096 --repeats 20 2>&1 | grep -E "plain|dropout")
echo "base training at $(( $(date +%s) - t0 )) s"
timeout 150 python bench/bench.py --dtypes fp32 --headdims 64,128 --seqlens 1024,4096 --causal 0,1 --out $OUT/fp32 > $OUT/bench_fp32.txt 2>&1
grep -E "^ fp32" $OUT/bench_fp32.txt
(cd .ab/t/base && PYTHONPATH=$PWD python $P/pre.py f64 16)
F="--dtypes fp64 --headdims 64,128 --seqlens 1024,2048 --causal 0,1 --no-backward --no-peers"
(cd .ab/t/base && PYTHONPATH=$PWD timeout 60 python bench/bench.py $F --out $OUT/fp64_base > $OUT/bench_fp64_base.txt 2>&1)
timeout 60 python bench/bench.py $F --out $OUT/fp64_new > $OUT/bench_fp64_new.txt 2>&1
grep -E "^ fp64" $OUT/bench_fp64_base.txt $OUT/bench_fp64_new.txt
echo "at $(( $(date +%s) - t0 )) s"
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 1 python bench/runs/2026-12-05-s32/sanitize_dropout.py > $OUT/memcheck_dropout.txt 2>&1
echo "memcheck rc=$?"; tail -1 $OUT/memcheck_dropout.txt
timeout 90 compute-sanitizer --tool racecheck --error-exitcode 1 python bench/runs/2026-12-05-s32/sanitize_dropout.py > $OUT/racecheck_dropout.txt 2>&1
echo "racecheck rc=$?"; tail -1 $OUT/racecheck_dropout.txt
echo "end at $(( $(date +%s) - t0 )) s"
