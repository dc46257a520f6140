"""Issue 24 probe: what a short walk costs the Hopper backward beyond its query tiles. The document-mask
row of bench/mods.py (16k, bf16, head dim 128, 16 heads, causal, 8 documents) and dense causal attention,
each backward once with every CTA's clocks (probe/cta_clocks.patch: %globaltimer at the CTA's start, at
the end of its consumers' main loops and of their epilogues, its SM and key tile). Prints per row: the
CTAs' duration fitted against their walks (query tiles visited) as fixed + per-tile cost, the epilogue's
share, the SMs' busy fraction over the kernel and the idle time between CTAs on an SM.

Prediction (session 46): the fixed cost a CTA (K/V load, first Q tile, dK/dV epilogue) is ~4-6 us against
~2.6 us a query tile, so at the document row's average walk of 24.8 tiles (dense causal: 129) it is
~8-10% of the CTA, a third to a half of the 24% by which the document row trails dense causal per FLOP.
(The same 2,048 CTAs run 3,168 tile steps a head against dense's 16,512: fixed costs alone would explain
all of the 24% only at ~9 tile steps, ~23 us, a CTA; the rest is the launch's tail and idle SMs.)

Run on a GPU from a tree with the patch applied (never landed):

    patch -p1 < bench/runs/2026-12-06-s46/probe/cta_clocks.patch
    PYTHONPATH=$PWD python bench/runs/2026-12-06-s46/probe/cta_clocks.py
"""

import cupy
import ml_dtypes
import numpy as np

import cupyflash

MODULES = []


class _KeptModule(cupy.RawModule):
    """cupy.RawModule, kept, so the probe array of the backward's module can be read."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        MODULES.append(((kwargs.get("name_expressions") or ("",))[0], self))


cupy.RawModule = _KeptModule  # (cupyflash's get_kernel looks it up at each compile)

SEQLEN, HEADS, HEADDIM, DOCUMENTS, BLOCK_M, BLOCK_N = 16384, 16, 128, 8, 64, 128


def documents(ragged):
    """bench/mods.py's document ids (and its ragged row's, boundaries moved inside blocks)."""
    rng = np.random.default_rng(0)
    cuts = np.sort(rng.choice(np.arange(1, 32), DOCUMENTS - 1, replace=False)) * SEQLEN // 32
    shifts = rng.integers(-(SEQLEN // 64) + 1, SEQLEN // 64, DOCUMENTS - 1)
    if ragged:
        cuts = cuts + shifts
    return np.repeat(np.arange(DOCUMENTS, dtype=np.int32), np.diff(np.concatenate([[0], cuts, [SEQLEN]])))


def walks(doc):
    """Query tiles (BLOCK_M rows) each key tile (BLOCK_N keys) visits: causal, and the block its tile lies
    in (128 x 128, as the BlockMask) holds a pair of one document (documents are contiguous runs)."""
    q_blocks = np.arange(SEQLEN // BLOCK_M) * BLOCK_M // 128
    lo, hi = doc.reshape(-1, 128).min(1), doc.reshape(-1, 128).max(1)
    result = []
    for kt in range(SEQLEN // BLOCK_N):
        qt = np.arange(SEQLEN // BLOCK_M)
        causal = qt * BLOCK_M + BLOCK_M - 1 >= kt * BLOCK_N
        kb = kt * BLOCK_N // 128
        same = (hi[q_blocks] >= lo[kb]) & (lo[q_blocks] <= hi[kb])
        result.append(int((causal & same).sum()))
    return np.array(result)


def probe_array():
    name, module = next((n, m) for n, m in reversed(MODULES) if "sm90_bwd<" in n)
    return name, cupy.ndarray((1 << 16, 6), cupy.uint64, memptr=module.get_global("cupyflash_cta_clock"))


def run(label, q, k, v, dout, options, tile_walks):
    out, lse = cupyflash.flash_attention(q, k, v, causal=True, return_lse=True, **options)
    for _ in range(2):
        cupyflash.flash_attention_backward(dout, q, k, v, out, lse, causal=True, **options)
    name, clocks = probe_array()
    clocks[:] = 0
    cupy.cuda.Device().synchronize()
    cupyflash.flash_attention_backward(dout, q, k, v, out, lse, causal=True, **options)
    cupy.cuda.Device().synchronize()
    c = cupy.asnumpy(clocks)
    c = c[c[:, 0] != 0].astype(np.int64)
    start, main_end, end, packed = c[:, 0], c[:, 1], c[:, 2], c[:, 3]
    sm, tile = packed >> 48, packed & 0xFFFF
    t0 = start.min()
    duration, epilogue = (end - start) / 1e3, (end - main_end) / 1e3  # us
    walk = tile_walks[tile]
    slope, fixed = np.polyfit(walk, duration, 1)
    makespan = (end.max() - t0) / 1e3
    busy = duration.sum() / (len(np.unique(sm)) * makespan)
    gaps = []
    for s in np.unique(sm):
        order = np.argsort(start[sm == s])
        st, en = start[sm == s][order], end[sm == s][order]
        gaps.extend((st[1:] - en[:-1]) / 1e3)
    print(f"\n{label}: {name[:70]}")
    print(f"  {len(c)} CTAs on {len(np.unique(sm))} SMs, kernel {makespan:.0f} us, SMs busy {busy:.1%}, "
          f"idle between CTAs on an SM {np.mean(gaps):.2f} us mean ({np.sum(gaps) / len(np.unique(sm)):.0f} us an SM)")
    print(f"  duration = {fixed:.2f} us + {slope:.3f} us x walk (walk mean {walk.mean():.1f}); "
          f"epilogue {epilogue.mean():.2f} us mean; fixed share of the CTAs' time "
          f"{fixed * len(c) / duration.sum():.1%}")
    print("  walk    CTAs  duration us  epilogue us  us / tile")
    for lo, hi in ((0, 4), (4, 8), (8, 16), (16, 32), (32, 64), (64, 128), (128, 257)):
        m = (walk >= lo) & (walk < hi)
        if m.any():
            print(f"  {lo:>3}-{hi - 1:<3} {m.sum():>5} {duration[m].mean():>12.2f} {epilogue[m].mean():>12.2f} "
                  f"{(duration[m] / np.maximum(walk[m], 1)).mean():>10.3f}")


def main():
    rng = np.random.default_rng(1)
    shape = (1, SEQLEN, HEADS, HEADDIM)
    q, k, v, dout = (cupy.asarray(rng.standard_normal(shape).astype(ml_dtypes.bfloat16)) for _ in range(4))
    dense = np.array([sum(1 for qt in range(SEQLEN // BLOCK_M) if qt * BLOCK_M + BLOCK_M - 1 >= kt * BLOCK_N)
                      for kt in range(SEQLEN // BLOCK_N)])
    run("dense causal", q, k, v, dout, {}, dense)
    for ragged in (False, True):
        doc = documents(ragged)
        mask = cupyflash.BlockMask.from_mask_mod(lambda b, h, qi, ki, d: d[b, qi] == d[b, ki], 1, 1, SEQLEN, SEQLEN,
                                                 (128, 128), (cupy.asarray(doc[None]),))
        run("ragged documents" if ragged else "documents", q, k, v, dout, {"block_mask": mask}, walks(doc))


if __name__ == "__main__":
    main()
