# Session 60's status call on whichever Hopper card comes (the floors of issues 22, 24 and 26 are set on the
# H200): precompile, decode with forced splits beside cuDNN (the H200 bytes-in-flight question of session
# 42), bench/decode.py's decode and MLA rows, bench/mods.py's document and ragged rows both ways, the float32
# 1k rows of bench/bench.py (those on an H200 only, ~300 s); on any card the forward clocks probe
# (fwd_probe/run.sh, issue 22's 1k rows) and the clustered forward's cluster count (clusters_probe.py).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; R=$PWD
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }; L=${LIMIT:-400}
# (CPU only, beside the rest: the probes' trees and their kernels)
(bash bench/runs/2026-12-07-s60/fwd_probe/run.sh prep > /tmp/prep.txt 2>&1
 rm -rf /tmp/Q && mkdir -p /tmp/Q && cp -r cupyflash kernels_cu setup.cfg /tmp/Q && cd /tmp/Q
 git apply --include='cupyflash/*' --include='kernels_cu/*' $R/bench/runs/2026-12-07-s59/pending/i26_quads.patch
 PYTHONPATH=/tmp/Q python -c "
from cupyflash import _kernels
from cupyflash._families import sm90
_kernels.precompile([v for v in sm90.FWD_PAIRS.variants() if v.dtype == 'bfloat16'], max_workers=2)"
 echo "probe trees ready at $(el) s" >> /tmp/prep.txt) >> /tmp/prep.txt 2>&1 &
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
[ -n "$SPLITS" ] && { timeout 60 python bench/runs/2026-12-06-s40/decode_splits.py 2>&1 | tail -6; echo "splits at $(el) s"; }
timeout 90 python bench/decode.py --quick --rows decode mla > $OUT/decode.txt 2>&1; echo "decode rc=$? at $(el) s"
timeout 90 python bench/mods.py --rows document,ragged --rounds 2 --out $OUT/mods > $OUT/mods.txt 2>&1; echo "mods rc=$? at $(el) s"
timeout 60 python bench/mods.py --rows document,ragged --per-call --out $OUT/mods_pc > $OUT/mods_pc.txt 2>&1; echo "mods per call rc=$? at $(el) s"
[ $(( L - $(el) )) -gt 40 ] && { timeout $(( L - $(el) - 5 )) python bench/bench.py --dtypes fp32 --headdims 64,128 --seqlens 1024 --rounds 2 --out $OUT/fp32 > $OUT/fp32.txt 2>&1; echo "fp32 rc=$? at $(el) s"; }
for f in decode mods mods_pc fp32; do echo "== $f"; grep -vE "^\s*$" $OUT/$f.txt | tail -22; done
fi
wait; tail -3 /tmp/prep.txt
bash bench/runs/2026-12-07-s60/fwd_probe/run.sh 2>&1 | tail -24; echo "probe at $(el) s"
# The quads' cluster count (the tree with pending/i26_quads.patch).
(cd /tmp/Q && PYTHONPATH=/tmp/Q timeout 60 python $R/bench/runs/2026-12-07-s60/clusters_probe.py 2>&1 | tail -4)
PYTHONPATH=$PWD timeout 30 python bench/runs/2026-12-07-s60/clusters_probe.py 2>&1 | tail -2; echo "done at $(el) s"
