# Session 54, call 5 (~225 s, any card; the session's last device seconds). T3 = the working tree (T2 +
# pending/i24_dq_in_kernel.patch, its reducing thread counting each share a tile late); T2 = the tree
# without it (/tmp/T2). Both trees' document and ragged kernels compile while the in-kernel conversion's
# tests run (the mask with unvisited tiles, the 8-document d128 GQA mask with a softcap, the mask bits),
# then the ncu A/B of T2 against T3.
export PYTHONUNBUFFERED=1
R=$PWD; H=$R/bench/runs/2026-12-07-s54
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"; t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
rm -rf /tmp/T2 && mkdir -p /tmp/T2 && cp -r cupyflash kernels_cu bench tests README.md ARCHITECTURE.md setup.cfg /tmp/T2
(cd /tmp/T2 && patch -R -p1 -s < $H/pending/i24_dq_in_kernel.patch) || exit 1
for t in /tmp/T2 $R; do
  (cd $t && PYTHONPATH=$t timeout 120 python bench/mods.py --rows ragged,document --no-peers --quick --repeats 1 \
    --warmup 0 --out /tmp/warm_$(basename $t) > /tmp/warm_$(basename $t).log 2>&1 || tail -3 /tmp/warm_$(basename $t).log) &
done
PYTHONPATH=$R timeout 110 python -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_gpu_mods.py \
  -k "query_tiles_no_key or tensor_core_kernels_with_both or kernels_read_the_bits" > $OUT/tests.txt 2>&1
echo "tests rc=$? at $(el) s"; tail -1 $OUT/tests.txt; grep -E "FAILED|ERROR " $OUT/tests.txt | cut -c1-200 | head -6
wait; echo "warm at $(el) s"
REPS=1 TREES="/tmp/T2 $R" timeout $(( 215 - $(el) )) bash $H/ncu_ab.sh 2>&1 | tail -3
echo "done at $(el) s"
