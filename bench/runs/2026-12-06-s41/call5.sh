# Session 41's decode candidates (~200 s; ran in session 42's first call): .ab/t/isw (the swizzle done on
# the global side: shared memory written in lane order, each lane reading the global chunk that belongs
# there), .ab/t/blk (sm_90: whole rows by cp.async.bulk, a row a lane, on an mbarrier per warp and
# stage; pending/i26_decode_bulk_rows.patch on both) and .ab/t/p32 (rows padded by 32 bytes instead of
# 16, e4m3 stages unpadded: every global sector lands in one shared sector; pending/i26_decode_pad32.patch):
# LDGSTS wavefronts and L2 sectors of kvc_fwd, then the decode rows beside `both`, and the e4m3 row.
export PYTHONUNBUFFERED=1
R=$PWD; S4=$R/bench/runs/2026-12-06-s40
nvidia-smi --query-gpu=name --format=csv,noheader
M='regex:^lts__t_sectors_srcunit_tex(_lookup_hit)?\.sum$,gpu__time_duration.sum,smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ldgsts.sum,dram__bytes_read.sum'
for t in isw blk p32; do
  echo "== $t"
  (cd $R/.ab/t/$t && PYTHONPATH=$PWD timeout 40 /usr/local/cuda/bin/ncu --metrics "$M" -k regex:kvc_fwd -c 1 python $S4/decode_ncu.py flash 2>&1 | grep -E "lts__|gpu__|smsp__|dram__" | sed -E 's/  +/ /g' | tee -a $OUT/decode_ncu_$t.txt)
done
for t in isw blk p32 both p32 blk isw both; do (cd $R/.ab/t/$t && PYTHONPATH=$PWD timeout 40 python $S4/decode_ab.py $t 2>&1 | tail -1 | tee -a $OUT/decode_ab.txt); done
for t in blk p32 both; do (cd $R/.ab/t/$t && PYTHONPATH=$PWD timeout 60 python bench/decode.py --quick --rows fp8 2>&1 | grep -i e4m3 | sed "s/^/$t: /"); done
