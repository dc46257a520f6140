# The forward clocks probe (~120 s, either card; no carry): fwd_clocks.patch on a copy of the tree in
# /tmp/fwdprobe (never the working tree), then fwd_clocks.py (float32 rows of bench.py and bf16 beside).
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; t0=$(date +%s)
rm -rf /tmp/fwdprobe && mkdir -p /tmp/fwdprobe && git archive HEAD cupyflash kernels_cu bench | tar -x -C /tmp/fwdprobe
(cd /tmp/fwdprobe && patch -p1 -s < bench/runs/2026-12-06-s47/fwd_probe/fwd_clocks.patch) || exit 1
cd /tmp/fwdprobe && PYTHONPATH=/tmp/fwdprobe timeout 400 python bench/runs/2026-12-06-s47/fwd_probe/fwd_clocks.py 2>&1 | tee $OUT/fwd_clocks.txt
echo "done at $(( $(date +%s) - t0 )) s"
