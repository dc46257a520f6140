# Session 63: session 62's call2.sh (never run; its file removed, this replaces it) with the v2 overlap patch (unrolled
# passes) and its probe (8 configs). Session 62's header:
# Session 62's second call (any Hopper card; the H200 rows only on an H200), after land_call.sh on the same
# warm machine: 1. issue 22's overlap probe (overlap_probe.py on a copy with s61's i22_planes_overlap.patch);
# 2. session 47's forward clocks probe (s60's fwd_probe/run.sh); 3. on an H200, while LIMIT allows: the float32
# 1k rows beside torch, decode and MLA rows, document and ragged rows. `call2.sh prep` only builds the copies
# and compiles their kernels (no GPU work: land_call.sh runs it beside its own precompile).
export PYTHONUNBUFFERED=1; R=$PWD
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }; L=${LIMIT:-560}
if [ "$1" = prep ] || [ ! -f /tmp/O/.compiled ]; then
  rm -rf /tmp/O && mkdir -p /tmp/O && cp -r cupyflash kernels_cu bench setup.cfg /tmp/O
  (cd /tmp/O && git apply --include='cupyflash/*' --include='kernels_cu/*' $R/bench/runs/2026-12-08-s63/pending/i22_planes_overlap_v2.patch) || echo "O: the patch does not apply"
  (cd /tmp/O && PYTHONPATH=/tmp/O python $R/bench/runs/2026-12-08-s63/overlap_probe.py --precompile && touch /tmp/O/.compiled) > /tmp/O_pre.txt 2>&1 &
  bash bench/runs/2026-12-07-s60/fwd_probe/run.sh prep > /tmp/prep.txt 2>&1 &
  wait; echo "call2 prep: compiled at $(el) s"; tail -n 2 /tmp/O_pre.txt /tmp/prep.txt
  [ "$1" = prep ] && exit 0
fi
nvidia-smi --query-gpu=name --format=csv,noheader
(cd /tmp/O && PYTHONPATH=/tmp/O timeout 120 python $R/bench/runs/2026-12-08-s63/overlap_probe.py --rounds 3 2>&1 | tee $OUT/overlap_probe.txt | tail -n 12); echo "probe at $(el) s"
timeout 150 bash bench/runs/2026-12-07-s60/fwd_probe/run.sh 2>&1 | tail -n 24; echo "clocks at $(el) s"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  export PYTHONPATH=$R
  [ $(( L - $(el) )) -gt 60 ] && { timeout $(( L - $(el) - 5 )) python bench/bench.py --dtypes fp32 --headdims 64,128 --seqlens 1024 --out $OUT/fp32 > $OUT/fp32.txt 2>&1; echo "fp32 rc=$? at $(el) s"; tail -n 16 $OUT/fp32.txt; }
  [ $(( L - $(el) )) -gt 60 ] && { timeout $(( L - $(el) - 5 )) python bench/decode.py --quick --rows decode mla > $OUT/decode.txt 2>&1; echo "decode rc=$? at $(el) s"; tail -n 20 $OUT/decode.txt; }
  # session 64: the H200's bytes-in-flight question (session 43): forced splits beside cuDNN, two rounds
  [ $(( L - $(el) )) -gt 60 ] && { timeout 60 python bench/runs/2026-12-06-s40/decode_splits.py > $OUT/decode_splits.txt 2>&1; echo "splits rc=$? at $(el) s"; tail -n 12 $OUT/decode_splits.txt; }
  [ $(( L - $(el) )) -gt 60 ] && { timeout $(( L - $(el) - 5 )) python bench/mods.py --rows document,ragged --rounds 2 --out $OUT/mods > $OUT/mods.txt 2>&1; echo "mods rc=$? at $(el) s"; tail -n 16 $OUT/mods.txt; }
fi
echo "call2 done at $(el) s"
