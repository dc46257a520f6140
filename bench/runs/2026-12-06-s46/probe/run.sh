# The CTA clocks probe (~200 s, either card; no carry): probe/cta_clocks.patch on a copy of the tree in
# /tmp/probe (never the working tree), then cta_clocks.py (dense causal, documents, ragged documents).
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; t0=$(date +%s)
rm -rf /tmp/probe && mkdir -p /tmp/probe && git archive HEAD cupyflash kernels_cu bench | tar -x -C /tmp/probe
(cd /tmp/probe && patch -p1 -s < bench/runs/2026-12-06-s46/probe/cta_clocks.patch) || exit 1
cd /tmp/probe && PYTHONPATH=/tmp/probe timeout 400 python bench/runs/2026-12-06-s46/probe/cta_clocks.py 2>&1 | tee $OUT/cta_clocks.txt
echo "done at $(( $(date +%s) - t0 )) s"
