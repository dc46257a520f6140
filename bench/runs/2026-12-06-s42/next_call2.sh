# Session 43's second call (~560 s, either card). Issue 26's paged prefill: pages of 128 run 0.82x dense
# (568 / 689 TFLOP/s, H200, session 42) though their boxes are the dense walk's; pages of 16 0.64x. ncu of
# dense, 128, 64 and 16 (paged_ncu.py): duration, tensor and issue activity, DRAM bytes, L2 hit rate, the
# TMA pipe, and the warp states. Prediction: the paged kernels' tensor pipe idles on the consumers' k_full
# waits (long scoreboard) because the 32-lane producer walk issues later; DRAM bytes equal.
# Then the issue-26 table on this card (bench/decode.py --quick: decode beside cuDNN and FA2, chunked
# prefill, call time, cascade, e4m3, MLA) and issue 25's FP8 rows each call alone (--per-call).
export PYTHONUNBUFFERED=1
R=$PWD; S=$R/bench/runs/2026-12-06-s42
nvidia-smi --query-gpu=name --format=csv,noheader; t0=$(date +%s)
export PYTHONPATH=$PWD
M='regex:sm__(pipe_tma_cycles_active|pipe_tensor_cycles_active|issue_active)\.avg\.pct_of_peak_sustained_active$,gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct,lts__t_sectors_srcunit_tex.sum'
timeout 120 /usr/local/cuda/bin/ncu --section WarpStateStats --metrics "$M" -k regex:sm90_fwd -c 4 python $S/paged_ncu.py > $OUT/paged_ncu.txt 2>&1
grep -E "sm90_fwd|pct|sum|hit_rate|Stall (Long|Wait|Barrier|Sleeping)" $OUT/paged_ncu.txt | sed -E 's/  +/ /g' | cut -c1-120 | head -60
echo "== paged gather ($(( $(date +%s) - t0 )) s)"
timeout 90 python $S/paged_gather.py 2>&1 | tail -7 | tee $OUT/paged_gather.txt
echo "== decode.py ($(( $(date +%s) - t0 )) s)"
timeout 170 python bench/decode.py --quick --rows decode calls mla fp8 > $OUT/decode_quick.txt 2>&1; tail -20 $OUT/decode_quick.txt
# The decode rows with num_splits forced (two CTAs an SM: twice the bytes in flight), beside cuDNN: on the
# H100 (session 40) they did not help, but the H200's 1.4x bandwidth needs 1.4x the bytes in flight, and
# its gap to cuDNN is 7% where the H100's is 2-4%. Prediction on an H200: 32-33 splits at 1 x 131072 and 4
# at 8 x 32768 close 2-4 points of the gap; on an H100 as session 40.
echo "== decode splits ($(( $(date +%s) - t0 )) s)"
timeout 90 python bench/runs/2026-12-06-s40/decode_splits.py 2>&1 | tail -6 | tee $OUT/decode_splits.txt
# Issue 22: the kernels of a float32 forward and backward call at d128 causal 1k (bench.py's row), their
# durations under ncu (the passes against the kernels).
echo "== fp32 parts ($(( $(date +%s) - t0 )) s)"
timeout 90 /usr/local/cuda/bin/ncu --clock-control none --metrics gpu__time_duration.sum python $S/fp32_parts.py > $OUT/fp32_parts.txt 2>&1
grep -E "^  [a-z_0-9]+|gpu__time_duration" $OUT/fp32_parts.txt | sed -E 's/\(.*//; s/  +/ /g' | paste - - | cut -c1-110
echo "== fp8 per call ($(( $(date +%s) - t0 )) s)"
timeout 100 python bench/fp8.py --headdims 64,128,256 --seqlens 4096,16384 --per-call 2>&1 | tail -14 | tee $OUT/fp8_per_call.txt
echo "done at $(( $(date +%s) - t0 )) s"
