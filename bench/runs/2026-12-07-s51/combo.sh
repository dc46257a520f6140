# Session 51's call on one machine (~550 s). The working tree holds HEAD + issue 24's three measured
# pending patches (s47 i24_element_bits_bwd, s49 i24_layout_whole_tiles, s50 i24_bwd_bits_fetched; applied
# uncommitted). On an H200: the GPU suite of that tree and memcheck of the Hopper forwards and backwards
# (a pass lands exactly that tree), then the chain with the fourth and fifth patches (s50
# i24_fwd_mask_words, s51 i24_bwd_mask_words) for their A/B, two rounds. On an H100 (the landing waits
# for an H200), or with MODE=data (a budget too short for the suite): the chain (two rounds), then
# passes.sh and the ncu samples of the ragged row (s49 ragged_source.sh on the working tree).
export PYTHONUNBUFFERED=1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"; t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
echo "tree hash: $(git ls-files -co --exclude-standard cupyflash kernels_cu tests README.md | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16)"
P="bench/runs/2026-12-06-s47/pending/i24_element_bits_bwd.patch bench/runs/2026-12-06-s49/pending/i24_layout_whole_tiles.patch
   bench/runs/2026-12-06-s50/pending/i24_bwd_bits_fetched.patch bench/runs/2026-12-06-s50/pending/i24_fwd_mask_words.patch
   bench/runs/2026-12-07-s51/pending/i24_bwd_mask_words.patch"
if [[ "$gpu" == *H200* && "${MODE:-land}" == land ]]; then
  export PYTHONPATH=$PWD
  python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
  timeout $(( 400 - $(el) )) python -m pytest -v -m gpu -n 16 --dist load -p no:cacheprovider tests > $OUT/suite.txt 2>&1
  echo "suite rc=$? at $(el) s"; tail -1 $OUT/suite.txt; grep -E "FAILED|ERROR " $OUT/suite.txt | cut -c1-220 | head -20
  echo "== memcheck sanitize_attention.py sm90"
  timeout $(( 455 - $(el) )) /usr/local/cuda/bin/compute-sanitizer --tool memcheck python tests/sanitize_attention.py sm90 2>&1 | tail -3
  echo "memcheck done at $(el) s"
  unset PYTHONPATH
  ROUNDS=2 PEERS=1 ROWS=ragged,document timeout $(( 585 - $(el) )) bash bench/runs/2026-12-06-s50/mods_chain.sh $P 2>&1 | tail -30
else
  ROUNDS=${ROUNDS:-2} PEERS=1 ROWS=ragged,document timeout 200 bash bench/runs/2026-12-06-s50/mods_chain.sh $P 2>&1 | tail -40
  echo "chain at $(el) s"
  timeout 100 bash bench/runs/2026-12-07-s51/passes.sh
  echo "passes at $(el) s"
  timeout $(( 580 - $(el) )) bash bench/runs/2026-12-06-s49/ragged_source.sh 2>&1 | tail -80
fi
echo "done at $(el) s"
