# Session 33, call 1: the backward's dropout draws shared by lane pairs (pending patch applied in the
# tree): the dropout tests (wide heads included), training rows both ways, memcheck; then merge host
# profile of main against session 31's merge_v2 (.ab/t/merge2).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
S=bench/runs/2026-12-05-s33
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
python $S/pre.py drop 16
timeout 150 python -m pytest -q -m gpu -n 8 -p no:cacheprovider -rfE tests/test_gpu_training.py tests/test_training.py 2>&1 | tail -3
timeout 70 python bench/training.py --seqlens 4096 --repeats 20 2>&1 | tee $OUT/training.txt | grep -E "plain|dropout|sinks|max"
timeout 70 python bench/training.py --seqlens 4096 --repeats 20 --per-call 2>&1 | tee $OUT/training_percall.txt | grep -E "plain|dropout|sinks|max"
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 1 python bench/runs/2026-12-05-s32/sanitize_dropout.py > $OUT/memcheck_dropout.txt 2>&1; echo "memcheck rc=$?"; tail -1 $OUT/memcheck_dropout.txt
timeout 30 python bench/runs/2026-12-05-s32/merge_prof.py 2>&1 | head -3
P=$PWD/bench/runs/2026-12-05-s32/merge_prof.py; (cd .ab/t/merge2 && PYTHONPATH=$PWD timeout 60 python $P 2>&1 | head -3)
echo "end at $(( $(date +%s) - t0 )) s"
