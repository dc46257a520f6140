"""float32 backward: sm90_bwd_planes vs sm80_bwd_parts against a float64 reference (max errors)."""
import os, sys, time
import numpy, cupy, cupyflash

CASES = ((1, 1, 1, 2, 2, 64, False), (1, 200, 1, 2, 2, 128, False), (1, 257, 300, 4, 2, 64, True),
         (2, 1000, 1000, 2, 2, 128, True), (1, 77, 2500, 2, 1, 96, False), (1, 128, 131, 2, 2, 37, False),
         (3, 64, 64, 2, 1, 128, False), (1, 700, 900, 2, 2, 64, False))

def ref(q, k, v, dout, causal):
    q, k, v, dout = (x.astype(numpy.float64) for x in (q, k, v, dout))
    b, sq, h, d = q.shape; sk, hk = k.shape[1], k.shape[2]; g = h // hk
    kr = numpy.repeat(k, g, axis=2); vr = numpy.repeat(v, g, axis=2)
    sc = 1 / numpy.sqrt(d)
    s = numpy.einsum("bqhd,bkhd->bhqk", q, kr) * sc
    if causal:
        i = numpy.arange(sq)[:, None]; j = numpy.arange(sk)[None, :]
        s = numpy.where(j <= i + sk - sq, s, -numpy.inf)
    m = s.max(-1, keepdims=True); m = numpy.where(numpy.isfinite(m), m, 0)
    p = numpy.exp(s - m); l = p.sum(-1, keepdims=True); p = p / numpy.where(l > 0, l, 1)
    out = numpy.einsum("bhqk,bkhd->bqhd", p, vr)
    dv = numpy.einsum("bhqk,bqhd->bkhd", p, dout)
    dp = numpy.einsum("bqhd,bkhd->bhqk", dout, vr)
    delta = numpy.einsum("bqhd,bqhd->bhq", dout, out)[..., None]
    ds = p * (dp - delta)
    dq = numpy.einsum("bhqk,bkhd->bqhd", ds, kr) * sc
    dk = numpy.einsum("bhqk,bqhd->bkhd", ds, q) * sc
    red = lambda x: x.reshape(b, sk, hk, g, -1).sum(3)
    return dq, red(dk), red(dv)

big = len(sys.argv) > 1
for n, (batch, sq, sk, h, hk, d, causal) in enumerate(CASES):
    rng = numpy.random.default_rng(n)
    q, k, v, do = (rng.standard_normal(s).astype(numpy.float32) * (3 if i < 2 else 1)
                   for i, s in enumerate(((batch, sq, h, d), (batch, sk, hk, d), (batch, sk, hk, d), (batch, sq, h, d))))
    qg, kg, vg, dog = (cupy.asarray(x) for x in (q, k, v, do))
    os.environ["CUPYFLASH_FAMILY"] = "sm90"
    out, lse = cupyflash.flash_attention(qg, kg, vg, causal=causal, return_lse=True)
    res = {}
    for fam in ("sm90", "sm80"):
        for precision in ("highest", "tf32"):
            os.environ["CUPYFLASH_FAMILY"] = fam
            o, l = cupyflash.flash_attention(qg, kg, vg, causal=causal, return_lse=True, precision=precision)
            g = cupyflash.flash_attention_backward(dog, qg, kg, vg, o, l, causal=causal, precision=precision)
            res[fam, precision] = [x.get() for x in g]
    r = ref(q, k, v, do, causal)
    line = f"case {n} {batch}x{sq}x{sk} h{h}/{hk} d{d} causal={causal}:"
    for precision in ("highest", "tf32"):
        line += f" [{precision}]"
        for name, a, b, x in zip("qkv", res["sm90", precision], res["sm80", precision], r):
            e90 = numpy.abs(a - x).max(); e80 = numpy.abs(b - x).max()
            line += f" d{name} {e90:.1e}/{e80:.1e}"
    print(line, flush=True)
