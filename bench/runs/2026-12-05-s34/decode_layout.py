"""Does the cache layout explain dense decoding's gap to cuDNN (issue 26)? bench/decode.py gives
cupyflash caches of shape (batch, context, heads_k, d), where a CTA (one kv head) reads 256-byte rows 2 KB
apart, and gives cuDNN (torch SDPA) (batch, heads_k, context, d), where each head's rows are one stream.
This times the decode kernel on both (the second as a transposed view of a head-major array: the same
shape and call, other strides), beside cuDNN and a device copy of the cache, TB/s of K and V bytes."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import decode  # noqa: E402
import harness  # noqa: E402
import numpy  # noqa: E402


def main():
    import cupy

    import cupyflash

    peers, _ = harness.load_torch()
    rng = numpy.random.default_rng(0)
    print("| batch x context | seq-major | head-major view | cuDNN | copy (read+write) | max |out diff| |")
    print("|---|---|---|---|---|---|")
    for batch, context in decode.DECODE_ROWS:
        gbytes = batch * context * decode.HEADS_K * decode.HEADDIM * 2 * 2 / 1e9
        q, k_cache, v_cache, options = decode.decode_inputs(batch, context, 0, rng)
        row = {}
        outs = {}
        for name, (k, v) in (("seq", (k_cache, v_cache)),
                             ("head", tuple(cupy.ascontiguousarray(x.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
                                            for x in (k_cache, v_cache)))):
            call = lambda q=q, k=k, v=v, options=options: cupyflash.flash_attention_with_kvcache(q, k, v, **options)  # noqa: E731
            outs[name] = call()
            row[name] = gbytes / decode.median_ms(call, 20)
            del k, v
        diff = float(cupy.abs(outs["seq"].astype(cupy.float32) - outs["head"].astype(cupy.float32)).max())
        copy_ms = decode.median_ms(lambda k=k_cache, v=v_cache: (k.copy(), v.copy()), 20)
        cudnn = decode.torch_peers(peers, batch, context, 20).get("cudnn") if peers is not None else None
        print(f"| {batch} x {context} | {row['seq']:.2f} | {row['head']:.2f} | "
              f"{gbytes / cudnn if cudnn else float('nan'):.2f} | {2 * gbytes / copy_ms:.2f} | {diff:.3g} |", flush=True)
        del q, k_cache, v_cache, options, outs
        harness.release_cached_memory()


if __name__ == "__main__":
    main()
