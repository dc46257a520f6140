"""How many clusters of the clustered paged forward fit at once (cuOccupancyMaxActiveClusters), for every
cluster size the tree builds (the pairs tree: 2; with pending/i26_quads.patch: 4 and 2). Session 60's
question: paged16_ab's problem has 32 work tiles of clusters of four; if fewer than 32 fit, the grid runs
two waves, which would explain the quads' half speed. PYTHONPATH=<tree> python clusters_probe.py"""
from cupyflash._families import common, sm90

device = common.current_device()
for variant in sm90.FWD_PAIRS.variants():
    if variant.dtype != "bfloat16":
        continue
    ctas = variant.param("ctas") if "ctas" in variant.kernel.tile_params else 2
    smem = sm90.fwd_smem_bytes(variant)
    function = common.function(variant, smem)
    fit = sm90.max_active_clusters(function, sm90.fwd_threads(variant), smem, ctas, device)
    print(f"{variant.key}: {device.sm_count} SMs, clusters of {ctas} that fit {fit} ({fit * ctas} CTAs)")
