# Session 41, call 4 (~450 s, any Hopper): issue 26's decode kernel with swizzled K/V tiles (.ab/t/swz =
# both + pending/i26_decode_swizzled_tiles.patch) against `both`: decode rows beside cuDNN in two rounds,
# the e4m3 row, the L2 sectors (ours 25.2M against cuDNN's 16.8M with padded rows), the KV-cache and
# FP8 GPU tests, memcheck and racecheck of the decode kernels.
export PYTHONUNBUFFERED=1
R=$PWD; S4=$R/bench/runs/2026-12-06-s40; S=$R/bench/runs/2026-12-06-s41
nvidia-smi --query-gpu=name --format=csv,noheader; t0=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - t0) )); }
for t in both swz swz both; do (cd $R/.ab/t/$t && PYTHONPATH=$PWD timeout 60 python $S4/decode_ab.py $t 2>&1 | tail -1); done
for t in swz both; do (cd $R/.ab/t/$t && PYTHONPATH=$PWD timeout 60 python bench/decode.py --quick --rows fp8 2>&1 | grep -i e4m3 | sed "s/^/$t: /"); done
cd $R/.ab/t/swz && export PYTHONPATH=$PWD
M='regex:^lts__t_(sectors|requests)_srcunit_tex(_lookup_hit|_lookup_miss)?\.sum$,dram__bytes_read.sum,gpu__time_duration.sum,smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ldgsts.sum'
timeout 60 /usr/local/cuda/bin/ncu --metrics "$M" -k regex:kvc_fwd -c 1 python $S4/decode_ncu.py flash 2>&1 | grep -E "lts__|dram__|gpu__|smsp__" | sed -E 's/  +/ /g'
echo "rows done at $(( $(date +%s) - t0 )) s"
timeout $(left 330) python -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_kvcache.py tests/test_fp8.py > $OUT/tests_swz.txt 2>&1
echo "tests rc=$? at $(( $(date +%s) - t0 )) s"; tail -1 $OUT/tests_swz.txt; grep -E "FAILED|ERROR " $OUT/tests_swz.txt | cut -c1-200 | head
CS=/usr/local/cuda/bin/compute-sanitizer
timeout $(left 400) $CS --tool memcheck --error-exitcode 1 python tests/sanitize_kvcache.py > $OUT/memcheck_swz.txt 2>&1
echo "memcheck rc=$? at $(( $(date +%s) - t0 )) s"; grep -E "ERROR SUMMARY" $OUT/memcheck_swz.txt | tail -1
timeout $(left 470) $CS --tool racecheck --kernel-name kns=kvc_fwd python tests/sanitize_kvcache.py > $OUT/racecheck_swz.txt 2>&1
echo "racecheck rc=$? at $(( $(date +%s) - t0 )) s"; grep -E "RACECHECK SUMMARY|hazard" $OUT/racecheck_swz.txt | tail -2
