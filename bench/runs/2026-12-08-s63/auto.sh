# Session 63's first call (never run: no device came), for whichever card comes. Tree: main with
# runs/2026-12-07-s60/pending/i26_pairs_three_stages.patch and runs/2026-12-07-s62/pending/
# d3_mbarrier_wait_scope.patch applied (`git apply` both first; land_call.sh warns if either is missing).
# On an H200: the landing call (land_call.sh: precompile, whole GPU suite, sanitizers, paged A/B; call2.sh's
# copies compiled beside it), then call2.sh on the same warm machine in a second call. On an
# H100: call2.sh first (its probes are card-agnostic), then land_call.sh in a second call as evidence only
# (the card rule lands kernel code on an H200 suite). Session 64: PREP3 also compiles s64's call3.sh copy (the
# mask-decision A/B), the second call on a warm H200 (then call2.sh).
card=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "card: $card"
if echo "$card" | grep -q H200; then
  PREP2=1 PREP3=1 LAND_LIMIT=${LAND_LIMIT:-400} LIMIT=${LIMIT:-440} bash bench/runs/2026-12-08-s63/land_call.sh
else
  LIMIT=${LIMIT:-440} bash bench/runs/2026-12-08-s63/call2.sh
fi
