# Session 50's first call (~400 s, either card, no carry): the backward's element bits (tests + A/B) and
# the landed paged walk's A/B. Then, on the same warm machine, runs/2026-12-06-s47/call3.sh (~250 s: the
# forward clocks probe for issue 22, the paged walk's stall sources for issue 26).
nvidia-smi --query-gpu=name --format=csv,noheader; t0=$(date +%s)
timeout 280 bash bench/runs/2026-12-06-s49/bwd_bits.sh 2>&1 | grep -v '^\.*$' | tail -32
timeout 200 bash bench/runs/2026-12-06-s49/paged_ab_landed.sh 2>&1 | tail -34
echo "done at $(( $(date +%s) - t0 )) s"
