# Session 62's second call (any Hopper card; the H200 rows only on an H200), after land_call.sh on the same
# warm machine: 1. issue 22's overlap probe (overlap_probe.py on a copy with s61's i22_planes_overlap.patch);
# 2. session 47's forward clocks probe (s60's fwd_probe/run.sh); 3. on an H200, while LIMIT allows: decode and
# MLA rows, document and ragged rows, the float32 1k rows beside torch.
export PYTHONUNBUFFERED=1; R=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }; L=${LIMIT:-560}
rm -rf /tmp/O && mkdir -p /tmp/O && cp -r cupyflash kernels_cu bench setup.cfg /tmp/O
(cd /tmp/O && git apply --include='cupyflash/*' $R/bench/runs/2026-12-07-s61/pending/i22_planes_overlap.patch) || echo "O: the patch does not apply"
(cd /tmp/O && PYTHONPATH=/tmp/O python bench/runs/2026-12-07-s61/overlap_ab.py --precompile) > /tmp/O_pre.txt 2>&1 &
bash bench/runs/2026-12-07-s60/fwd_probe/run.sh prep > /tmp/prep.txt 2>&1 &
wait; echo "compiled at $(el) s"; tail -2 /tmp/O_pre.txt /tmp/prep.txt
(cd /tmp/O && PYTHONPATH=/tmp/O timeout 120 python $R/bench/runs/2026-12-07-s62/overlap_probe.py --rounds 3 2>&1 | tee $OUT/overlap_probe.txt | tail -8); echo "probe at $(el) s"
timeout 150 bash bench/runs/2026-12-07-s60/fwd_probe/run.sh 2>&1 | tail -24; echo "clocks at $(el) s"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  export PYTHONPATH=$R
  [ $(( L - $(el) )) -gt 60 ] && { timeout $(( L - $(el) - 5 )) python bench/bench.py --dtypes fp32 --headdims 64,128 --seqlens 1024 --out $OUT/fp32 > $OUT/fp32.txt 2>&1; echo "fp32 rc=$? at $(el) s"; tail -16 $OUT/fp32.txt; }
  [ $(( L - $(el) )) -gt 60 ] && { timeout $(( L - $(el) - 5 )) python bench/decode.py --quick --rows decode mla > $OUT/decode.txt 2>&1; echo "decode rc=$? at $(el) s"; tail -20 $OUT/decode.txt; }
  [ $(( L - $(el) )) -gt 60 ] && { timeout $(( L - $(el) - 5 )) python bench/mods.py --rows document,ragged --rounds 2 --out $OUT/mods > $OUT/mods.txt 2>&1; echo "mods rc=$? at $(el) s"; tail -16 $OUT/mods.txt; }
fi
echo "done at $(el) s"
