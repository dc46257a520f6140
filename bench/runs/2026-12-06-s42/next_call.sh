# Session 43's first call (~570 s, either card; trees from build_trees.sh, carry [".ab/t"]).
# 1. ldgsts_probe.py: which shared layouts keep a warp's cp.async of whole rows at 4 wavefronts and 16 L2
#    sectors (cuDNN's decode) and what each streams at. Prediction: flat 4/16; pad16 ~10/24 and pad32 ~14/32
#    as in the kernel; xor16 and gperm 12/32 (as swz and isw measured in the kernel) unless the kernel's
#    other copies caused those; xor32 4/16 if what splits a copy is a global sector not landing whole and
#    in order; pairs (shared writes in lane order, 16 rows' sector p per copy) 4/16 if only the shared
#    side's order matters; pairsw (its sector halves swapped every other 4 rows, conflict-free ldmatrix)
#    tells whether a swap inside a sector splits; GB/s highest where the sectors are fewest.
# 2. mufu_probe.py: exponentials per clock per SM for 1-4 warps per SMSP. Prediction: ~16 (4 lanes a clock
#    per SMSP) at 2+ warps, ~8-10 at one warp with the softmax's FFMA and sums in the chain (session 41's
#    ncu: a softmax phase of one warp per SMSP took ~2x its MUFU time).
# 3. FP8 rows, main against nt (no pingpong turns: the two warpgroups' softmax phases may overlap), and
#    at d64 m192 (three consumer warpgroups, 192-row tiles) and m192nt (both: FlashAttention-3's FP8 d64).
#    Prediction: if (2) shows one warp cannot keep the MUFU busy, d64/d128 +10-30% for nt and d64 +15-30%
#    for m192nt (target 650 at d64 16k, main 520); else nt within noise and m192 +5-15%.
# 4. decode_ab.py, one round each: main, x32 (sector swizzle: ldmatrix 2-way conflicts, whole sectors in
#    order), dp (sector-major warp blocks, a copy = sector p of 16 rows in lane order; ldmatrix 2-way) and
#    dpw (dp with every other four rows' sector halves swapped: conflict-free ldmatrix) and flat (plain
#    unpadded rows: copies in lane order, ldmatrix 8-way conflicts); ncu of their copies;
#    then the KV-cache GPU tests of the one (1) predicts best (dpw's by default, in the time left).
#    Prediction: whichever layout (1) shows at 4 wavefronts / 16 sectors reaches cuDNN's time (<= 1.00 on
#    the H100, from 1.025-1.044; the H200 gap 7%).
export PYTHONUNBUFFERED=1
R=$PWD; S=$R/bench/runs/2026-12-06-s42; S4=$R/bench/runs/2026-12-06-s40
nvidia-smi --query-gpu=name --format=csv,noheader; t0=$(date +%s)
timeout 60 python $S/ldgsts_probe.py 2>&1 | tee $OUT/ldgsts_time.txt
M='smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ldgsts.sum,lts__t_sectors_srcunit_tex.sum,smsp__inst_executed_op_ldgsts.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ldgsts.sum,gpu__time_duration.sum'
timeout 120 /usr/local/cuda/bin/ncu --metrics "$M" -k regex:probe python $S/ldgsts_probe.py --ncu > $OUT/ldgsts_ncu.txt 2>&1
grep -E "probe<|lts__|smsp__|l1tex__|gpu__" $OUT/ldgsts_ncu.txt | sed -E 's/  +/ /g' | sed -E 's/\(const unsigned char \*, const unsigned char \*, int, int \*\)//' | cut -c1-100
echo "== mufu ($(( $(date +%s) - t0 )) s)"; timeout 40 python $S/mufu_probe.py 2>&1 | tee $OUT/mufu.txt
for t in main nt nt main; do
  echo "== fp8 $t ($(( $(date +%s) - t0 )) s)"
  (cd .ab/t/$t && PYTHONPATH=$PWD timeout 60 python bench/fp8.py --headdims 64,128,256 --seqlens 4096,16384 2>&1 | grep -E "^ +[0-9]" | tee -a $OUT/fp8_$t.txt)
done
for t in m192 m192nt m192nt m192; do
  echo "== fp8 d64 $t ($(( $(date +%s) - t0 )) s)"
  (cd .ab/t/$t && PYTHONPATH=$PWD timeout 50 python bench/fp8.py --headdims 64 --seqlens 4096,16384 2>&1 | grep -E "^ +[0-9]" | tee -a $OUT/fp8_$t.txt)
done
for t in main x32 dp dpw flat; do (cd .ab/t/$t && PYTHONPATH=$PWD timeout 40 python $S4/decode_ab.py $t 2>&1 | tail -1 | tee -a $OUT/decode_ab.txt); done
M2='regex:^lts__t_sectors_srcunit_tex\.sum$,gpu__time_duration.sum,smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ldgsts.sum,smsp__inst_executed_op_ldsm.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum'
for t in x32 dp dpw flat; do
  echo "== ncu $t"
  (cd .ab/t/$t && PYTHONPATH=$PWD timeout 40 /usr/local/cuda/bin/ncu --metrics "$M2" -k regex:kvc_fwd -c 1 python $S4/decode_ncu.py flash 2>&1 | grep -E "lts__|gpu__|smsp__|l1tex__" | sed -E 's/  +/ /g' | tee $OUT/decode_ncu_$t.txt)
done
left=$(( 560 - ($(date +%s) - t0) ))
D=${DECODE_TREE:-dpw}
echo "== $D and m192 tests ($(( $(date +%s) - t0 )) s, $left s left)"
(cd .ab/t/$D && PYTHONPATH=$PWD timeout $(( left / 2 )) python -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_kvcache.py > $OUT/${D}_tests.txt 2>&1; tail -1 $OUT/${D}_tests.txt)
left=$(( 570 - ($(date +%s) - t0) ))
(cd .ab/t/m192 && PYTHONPATH=$PWD timeout $left python -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_fp8.py > $OUT/m192_tests.txt 2>&1; tail -1 $OUT/m192_tests.txt)
echo "done at $(( $(date +%s) - t0 )) s"
