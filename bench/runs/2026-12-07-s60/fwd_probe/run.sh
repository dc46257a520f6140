# The forward clocks probe of session 47 (never run), its patch rebased on session 60's main (~120 s, any
# Hopper card): fwd_clocks.patch on a copy of the tree in /tmp/fwdprobe (never the working tree), then
# session 47's fwd_clocks.py (bench.py's float32 rows and a bf16 one beside). `run.sh prep` only builds the
# copy and compiles its kernels (no GPU work: run it beside a benchmark), `run.sh` then runs the probe.
export PYTHONUNBUFFERED=1
R=$PWD
if [ "$1" = prep ] || [ ! -d /tmp/fwdprobe ]; then
  rm -rf /tmp/fwdprobe && mkdir -p /tmp/fwdprobe && cp -r cupyflash kernels_cu setup.cfg /tmp/fwdprobe
  (cd /tmp/fwdprobe && git apply $R/bench/runs/2026-12-07-s60/fwd_probe/fwd_clocks.patch) || exit 1
  (cd /tmp/fwdprobe && PYTHONPATH=/tmp/fwdprobe python -c "
from cupyflash import _kernels
from cupyflash._families import sm90
_kernels.precompile([v for v in sm90.FWD_PLANES.variants() if not any(v.flags)]
                    + [v for v in sm90.FWD.variants() if v.dtype == 'bfloat16' and v.tile[0] == 128 and not any(v.flags)], max_workers=4)")
  [ "$1" = prep ] && exit 0
fi
cd /tmp/fwdprobe && PYTHONPATH=/tmp/fwdprobe timeout 200 python $R/bench/runs/2026-12-06-s47/fwd_probe/fwd_clocks.py 2>&1 | tee $OUT/fwd_clocks.txt
