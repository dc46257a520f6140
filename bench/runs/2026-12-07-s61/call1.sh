# Session 61's first call (any Hopper card; ~200 s): the float32 forward's graph by parts (issue 22): its
# GPU tests, overlap_ab.py (parts and SMs, both timings), bench.py's float32 1k rows beside torch.
export PYTHONUNBUFFERED=1; R=$PWD; export PYTHONPATH=$R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
python bench/runs/2026-12-07-s61/overlap_ab.py --precompile
echo "compiled at $(el) s"
python -c "from cupyflash import _plan; print('started edges:', _plan.started_edges())"
timeout 90 python -m pytest -q -p no:cacheprovider tests/test_gpu_sm90.py -k "graph_by_parts" tests/test_plans.py 2>&1 | tail -3
echo "tests at $(el) s"
timeout 120 python bench/runs/2026-12-07-s61/overlap_ab.py --rounds 2 --configs off,p3s16,p2s16,p4s20 2>&1 | tee $OUT/overlap_ab.txt | tail -40
echo "overlap at $(el) s"
timeout 80 python bench/bench.py --dtypes fp32 --headdims 64,128 --seqlens 1024 --no-backward --out $OUT/fp32 > $OUT/fp32.txt 2>&1; echo "fp32 rc=$? at $(el) s"; tail -14 $OUT/fp32.txt
echo "done at $(el) s"
