# Session 60's last call (any Hopper card, ~200 s, then the H200's status rows while LIMIT allows):
# 1. paged16_ab.py, main (R: pairs on two stages) against S3 (main + pending/i26_pairs_three_stages.patch),
#    pages of 16, 32 and 64, three rounds;
# 2. the forward clocks probe (fwd_probe/run.sh, issue 22's 1k rows);
# 3. clusters_probe.py on main and on main + pending/i26_quads.patch (the quads' cluster count);
# 4. on an H200: bench/decode.py's decode and MLA rows, bench/mods.py's document and ragged rows, the float32
#    1k rows of bench/bench.py (issues 26, 24 and 22's floors are set on that card).
export PYTHONUNBUFFERED=1; R=$PWD; S=$R/bench/runs/2026-12-07-s57
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }; L=${LIMIT:-360}
PRE="from cupyflash import _kernels
from cupyflash._families import sm90
_kernels.precompile([v for v in sm90.FWD.variants() if v.dtype == 'bfloat16' and v.tile[:2] == (128, 128) and not any(v.flags)]
                    + [v for v in sm90.FWD_PAIRS.variants() if v.dtype == 'bfloat16'], max_workers=2)"
rm -rf /tmp/S3 /tmp/Q && mkdir -p /tmp/S3 /tmp/Q
cp -r cupyflash kernels_cu bench setup.cfg /tmp/S3 && (cd /tmp/S3 && git apply $R/bench/runs/2026-12-07-s60/pending/i26_pairs_three_stages.patch) || echo "S3: the patch does not apply"
cp -r cupyflash kernels_cu setup.cfg /tmp/Q && (cd /tmp/Q && git apply --include='cupyflash/*' --include='kernels_cu/*' $R/bench/runs/2026-12-07-s59/pending/i26_quads.patch) || echo "Q: the patch does not apply"
PYTHONPATH=$R python -c "$PRE" &
(cd /tmp/S3 && PYTHONPATH=/tmp/S3 python -c "$PRE") &
(cd /tmp/Q && PYTHONPATH=/tmp/Q python -c "$PRE") &
bash bench/runs/2026-12-07-s60/fwd_probe/run.sh prep > /tmp/prep.txt 2>&1 &
wait; echo "compiled at $(el) s"
for round in 1 2 3; do for t in $R /tmp/S3; do
  echo "$(basename $t) paged: $(cd $t && PYTHONPATH=$t timeout 60 python $S/paged16_ab.py --pages 16,32,64 2>&1 | tail -1) at $(el) s"
done; done
(cd /tmp/Q && PYTHONPATH=/tmp/Q timeout 60 python $R/bench/runs/2026-12-07-s60/clusters_probe.py 2>&1 | tail -4)
PYTHONPATH=$R timeout 30 python bench/runs/2026-12-07-s60/clusters_probe.py 2>&1 | tail -2
timeout 150 bash bench/runs/2026-12-07-s60/fwd_probe/run.sh 2>&1 | tail -24; echo "probe at $(el) s"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  export PYTHONPATH=$R
  [ $(( L - $(el) )) -gt 60 ] && { timeout $(( L - $(el) - 5 )) python bench/decode.py --quick --rows decode mla > $OUT/decode.txt 2>&1; echo "decode rc=$? at $(el) s"; tail -20 $OUT/decode.txt; }
  [ $(( L - $(el) )) -gt 60 ] && { timeout $(( L - $(el) - 5 )) python bench/mods.py --rows document,ragged --rounds 2 --out $OUT/mods > $OUT/mods.txt 2>&1; echo "mods rc=$? at $(el) s"; tail -16 $OUT/mods.txt; }
  [ $(( L - $(el) )) -gt 60 ] && { timeout $(( L - $(el) - 5 )) python bench/bench.py --dtypes fp32 --headdims 64,128 --seqlens 1024 --out $OUT/fp32 > $OUT/fp32.txt 2>&1; echo "fp32 rc=$? at $(el) s"; tail -16 $OUT/fp32.txt; }
fi
echo "done at $(el) s"
