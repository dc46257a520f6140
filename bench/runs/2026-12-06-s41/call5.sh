# Session 41, call 5 (the last ~90 s): the swizzle done on the global side (.ab/t/isw: shared memory
# written in lane order, each lane reading the global chunk that belongs there): LDGSTS wavefronts and
# L2 sectors of kvc_fwd, then its decode rows beside `both`.
export PYTHONUNBUFFERED=1
R=$PWD; S4=$R/bench/runs/2026-12-06-s40
nvidia-smi --query-gpu=name --format=csv,noheader
M='regex:^lts__t_sectors_srcunit_tex(_lookup_hit)?\.sum$,gpu__time_duration.sum,smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ldgsts.sum'
(cd $R/.ab/t/isw && PYTHONPATH=$PWD timeout 40 /usr/local/cuda/bin/ncu --metrics "$M" -k regex:kvc_fwd -c 1 python $S4/decode_ncu.py flash 2>&1 | grep -E "lts__|gpu__|smsp__" | sed -E 's/  +/ /g' | tee $OUT/isw_ncu.txt)
for t in isw both; do (cd $R/.ab/t/$t && PYTHONPATH=$PWD timeout 40 python $S4/decode_ab.py $t 2>&1 | tail -1 | tee -a $OUT/isw_ab.txt); done
