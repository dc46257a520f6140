# Session 41's second call (~320 s, any Hopper card): issue 25's FP8 forward with a share of its
# exponentials on the FMA pipe (the degree-3 poly_exp2: relative error below 8.6e-5, far under e4m3's
# rounding of P). At head dim 128 a tile's ex2s take about as many SFU clocks as its QGMMA products;
# share 1 moves a quarter (MUFU.EX2 132 -> 100 in the SASS, +~7 FMA-pipe instructions each), share 2 a
# half (68). Build first, on the CPU (next_call.sh's `both` is the baseline: its FP8 forward is main's):
#   for v in 1 2; do mkdir -p .ab/t/p$v; git archive HEAD cupyflash kernels_cu bench tests tools README.md ARCHITECTURE.md | tar -x -C .ab/t/p$v
#     rm -rf .ab/t/p$v/bench/runs; (cd .ab/t/p$v && patch -p1 -s < ../../../bench/runs/2026-12-06-s40/pending/i25_fp8_poly_exp2_share$v.patch); done
# and pass carry [".ab/t"]. Prediction: share 1 +5-15% on the non-causal 16k row (750 TFLOP/s at 4k on the
# H200, target 1,000 at 16k); share 2 issue-bound, below share 1. Land share 1 (with its comments
# updated: softmax.cuh's "degree 2 beside e4m3's rounding", kmajor_operands.cuh's note) if it wins in both
# rounds and its FP8 tests pass.
export PYTHONUNBUFFERED=1
R=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
for t in both p1 p2 p2 p1 both; do
  echo "== $t ($(( $(date +%s) - t0 )) s)"
  (cd .ab/t/$t && PYTHONPATH=$PWD timeout 90 python bench/fp8.py --headdims 128 --seqlens 4096,16384 2>&1 | grep -E "^\||128" | tail -6)
done
for t in p1 p2; do
  (cd .ab/t/$t && PYTHONPATH=$PWD timeout 120 python -m pytest -q -m gpu -p no:cacheprovider tests/test_fp8.py 2>&1 | tail -2)
done
echo "done at $(( $(date +%s) - t0 )) s"
