# Session 39's first call (~540 s). Build first, on the CPU (v2: main + the Hopper MLA kernel, which ran on
# no H200 in session 38 and so waits as a patch; mla3-5: v2 + each candidate):
#   rm -rf .ab/t && for t in v2 mla3 mla4 mla5; do mkdir -p .ab/t/$t && git archive HEAD cupyflash kernels_cu bench tests README.md ARCHITECTURE.md | tar -x -C .ab/t/$t; done
#   P=../../../bench/runs/2026-12-06-s38/pending
#   for t in v2 mla3 mla4 mla5; do (cd .ab/t/$t && patch -p1 -s < $P/i26_mla_sm90_v2.patch); done
#   (cd .ab/t/mla3 && patch -p1 -s < $P/i26_mla_s_under_pv.patch); (cd .ab/t/mla4 && patch -p1 -s < $P/i26_mla_32key_tiles.patch)
#   (cd .ab/t/mla5 && patch -p1 -s < $P/i26_mla_32key_s_under_pv.patch)
# and pass carry=[".ab/t"]. The named-barrier probe's modes one a process under racecheck; MLA times of
# main (kvc_mla), v2, mla3 (warpgroup 0's next S queued behind its P_o V_o), mla4 (32-key tiles in four
# stages) and mla5 (both); ncu of v2's kvc_mla_sm90 at 128 heads (stall reasons, per-instruction stall
# samples); the candidate trees' MLA tests with the time left.
export PYTHONUNBUFFERED=1
R=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
LIMIT=${LIMIT:-540}
left() { echo $(( LIMIT - ($(date +%s) - t0) )); }
for m in 0 1 2; do PYTHONPATH=$R timeout 40 compute-sanitizer --tool racecheck python tests/sanitize_named_barrier.py $m > $OUT/probe_$m.txt 2>&1; echo "mode $m rc=$?"; grep -E "sums|SUMMARY" $OUT/probe_$m.txt; grep -A1 "Race reported" $OUT/probe_$m.txt | grep -o "at handoff+0x[0-9a-f]*" | paste -sd' '; done
T=$R/bench/runs/2026-12-06-s37/mla_time.py
PYTHONPATH=$R timeout 40 python $T 16 > $OUT/time_main.txt 2>&1; echo "main (kvc_mla):"; cat $OUT/time_main.txt
for t in v2 mla3 mla4 mla5; do (cd .ab/t/$t && PYTHONPATH=$PWD timeout 60 python $T 128 16 32 > $OUT/time_$t.txt 2>&1); echo "$t:"; cat $OUT/time_$t.txt; done
(cd .ab/t/v2 && PYTHONPATH=$PWD timeout 30 python $T 128 16 > $OUT/time_v2_again.txt 2>&1); echo "v2 again:"; tail -2 $OUT/time_v2_again.txt
(cd .ab/t/v2 && PYTHONPATH=$PWD timeout 80 ncu -k regex:kvc_mla_sm90 -s 1 -c 1 --page raw --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed python $T 128 > $OUT/ncu_stalls.txt 2>&1); echo "ncu stalls rc=$?"; grep -E "stalled|tensor|dram" $OUT/ncu_stalls.txt | awk '$NF+0 > 0.05' | sort -k3 -g -r | head -24
(cd .ab/t/v2 && PYTHONPATH=$PWD timeout 100 ncu -k regex:kvc_mla_sm90 -s 1 -c 1 --section SourceCounters --section WarpStateStats --page source --print-source sass --csv python $T 128 > $OUT/ncu_source.csv 2>&1); echo "ncu source rc=$? at $(( $(date +%s) - t0 )) s"; wc -l $OUT/ncu_source.csv
for t in mla5 mla4 mla3; do
  (cd .ab/t/$t && PYTHONPATH=$PWD timeout $(( $(left) / 2 )) python -m pytest -q -x -p no:cacheprovider -n 8 tests/test_kvcache.py -k mla > $OUT/tests_$t.txt 2>&1); echo "$t tests rc=$? at $(( $(date +%s) - t0 )) s"; tail -1 $OUT/tests_$t.txt; grep -E "^E |FAILED" $OUT/tests_$t.txt | cut -c1-200 | head -5
done
echo "end at $(( $(date +%s) - t0 )) s"
