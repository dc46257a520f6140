"""The float32 Hopper backward's accuracy over many inputs: tests/test_gpu_mods.py's
test_wide_kernels_with_both_functions[float32-] (d64, GQA 2/1, a softcap 20 score_mod inside a document
mask, 230 x 230 causal) at seeds 0 .. N-1, printing each gradient's error over the test's bound (3 x the
plain float32 implementation's error + one ulp; above 1 fails the rule). Run in two trees (main with the
float-pair lse, and 7be22f4 with the float64 lse) to see whether the float pair moves the errors.
Usage: python wide_float32_seeds.py [N]"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
import cupy  # noqa: E402
import helpers  # noqa: E402
from test_mods import _documents, _softcap_mod, same_document  # noqa: E402

import cupyflash  # noqa: E402


def ratios(seed):
    doc = cupy.asarray(_documents(1, 230, 3, 26))
    mask = cupyflash.BlockMask.from_mask_mod(same_document, 1, 1, 230, 230, block_size=(64, 64), buffers=(doc,))
    options = {"block_mask": mask, "score_mod": _softcap_mod(20.0)}
    q, k, v = helpers.random_qkv(cupy, 1, 230, 230, 2, 1, 64, 64, np.float32, seed)
    dout = helpers.random_normal(cupy, (1, 230, 2, 64), np.float32, np.random.default_rng(seed + 1))
    out, lse = cupyflash.flash_attention(q, k, v, causal=True, return_lse=True, **options)
    grads = dict(zip(("dq", "dk", "dv"), cupyflash.flash_attention_backward(dout, q, k, v, out, lse, causal=True,
                                                                            **options)))
    ref = helpers.oracle(q, k, v, True, dout=dout, **options)
    base = helpers.plain(q, k, v, True, dout=dout, **options)
    result = {}
    for name, got in grads.items():
        err = np.abs(helpers.to_host(got).astype(np.float64) - ref[name]).max()
        plain = np.abs(base[name].astype(np.float64) - ref[name]).max()
        bound = helpers.GRAD_FACTOR * plain + helpers._ulp(np.abs(ref[name]).max(), np.float32)
        result[name] = err / bound
    return result


def main():
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    worst = {}
    for seed in range(count):
        r = ratios(seed)
        print(seed, " ".join(f"{n} {x:.3f}" for n, x in r.items()), flush=True)
        for n, x in r.items():
            worst[n] = max(worst.get(n, 0.0), x)
    print("worst", " ".join(f"{n} {x:.3f}" for n, x in worst.items()))


if __name__ == "__main__":
    main()
