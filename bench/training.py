"""The training features' cost (issue 23's targets): each feature beside the same call without it.

Run from the repository root on a GPU::

    python bench/training.py                    # head dim 128, seqlen 4096, bf16, causal and not
    python bench/training.py --seqlens 1024,4096 --per-call

Rows: flash_attention and its backward at (batch, seqlen, 16 heads, 128) bf16 (batch * seqlen = 16k
tokens), plain, with sinks, with return_max_score (forward), with dropout 0.1; TFLOP/s (forward
4 B H S^2 D, halved when causal; backward 2.5x) and each feature's time over the plain call's. Targets:
sinks and the maximum score at most 3% slower, dropout at most 12% (forward) and 15% (backward).
Times: CUDA events around calls enqueued back to back (medians), or with --per-call each call alone
after a synchronize (host time included). With --rounds N the features are timed N times in turn, the
order reversed every other round, and each ratio is the median over rounds of the feature's time over
the plain call's in the same round: a few-percent target needs that, since the GPU's clocks drift
between calls measured minutes apart (the same plain forward ran 645 and 685 TFLOP/s in two runs of one
session). Features the installed version refuses on the GPU print their error instead of a time.
"""

import argparse
import sys

import harness

HEADS, HEADDIM, TOKENS = 16, 128, 16384
FEATURES = ("plain", "sinks", "max_score", "dropout")


def _options(feature, heads):
    import cupy
    import numpy

    if feature == "sinks":
        return {"sinks": cupy.asarray(numpy.linspace(-1, 1, heads).astype(numpy.float32))}
    if feature == "max_score":
        return {"return_max_score": True}
    if feature == "dropout":
        return {"dropout_p": 0.1, "dropout_seed": 1234}
    return {}


def _rows(seqlen, causal, settings, features=FEATURES):
    """(feature, direction, measurement) of one shape, the features timed in the order given."""
    import cupyflash

    batch = max(1, TOKENS // seqlen)
    q, k, v, dout = harness.make_inputs((batch, seqlen, HEADS, HEADDIM), harness.dtype("bf16"), seed=seqlen)
    flops = harness.forward_flops(batch, HEADS, seqlen, seqlen, HEADDIM, causal)
    rows = []
    for feature in features:
        options = _options(feature, HEADS)

        def forward(options=options):
            return lambda: cupyflash.flash_attention(q, k, v, causal=causal, **options)

        rows.append((feature, "forward", harness.measure(forward, flops, settings)))
        if feature == "max_score":
            continue
        backward_options = {n: x for n, x in options.items() if n != "return_max_score"}

        def backward(options=backward_options):
            out, lse = cupyflash.flash_attention(q, k, v, causal=causal, return_lse=True, **options)
            return lambda: cupyflash.flash_attention_backward(dout, q, k, v, out, lse, causal=causal, **options)

        rows.append((feature, "backward", harness.measure(backward, harness.backward_flops(flops), settings)))
    return rows


def _rounds(seqlen, causal, settings, rounds):
    """(feature, direction, measurement over the rounds (harness.combine_rounds: the median of the rounds'
    medians), median ratio to plain) of one shape over
    ``rounds`` rounds, FEATURES in turn, reversed every other round (so a drift favours no feature)."""
    times, ratios = {}, {}
    for r in range(rounds):
        rows = _rows(seqlen, causal, settings, FEATURES[::-1] if r % 2 else FEATURES)
        plain = {direction: m.get("median_ms") for feature, direction, m in rows if feature == "plain"}
        for feature, direction, m in rows:
            times.setdefault((feature, direction), []).append(m)
            if "error" not in m and plain[direction]:
                ratios.setdefault((feature, direction), []).append(m["median_ms"] / plain[direction])
    result = []
    for (feature, direction), ms in times.items():
        timed = [m for m in ms if "error" not in m]
        m = harness.combine_rounds(timed) if timed else ms[0]
        ratio = ratios.get((feature, direction))
        result.append((feature, direction, m, harness.median(ratio) if ratio else None))
    order = {f: i for i, f in enumerate(FEATURES)}
    return sorted(result, key=lambda row: (order[row[0]], row[1] != "forward"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqlens", default="4096", help="comma-separated sequence lengths")
    parser.add_argument("--per-call", action="store_true", help="time each call alone (host time included)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=1, help="time the features this many times in turn")
    args = parser.parse_args(argv)
    harness.require_gpu("training.py")
    settings = harness.Settings(warmup=3, repeats=args.repeats, backward=True, peers=False,
                                timing="per-call" if args.per_call else "back-to-back")
    print(f"{'seqlen':>6} {'causal':>6} {'feature':10} {'pass':9} {'TFLOP/s':>8} {'vs plain':>9}")
    for seqlen in (int(s) for s in args.seqlens.split(",")):
        for causal in (False, True):
            for feature, direction, m, ratio in _rounds(seqlen, causal, settings, args.rounds):
                if "error" in m:
                    print(f"{seqlen:6} {int(causal):6} {feature:10} {direction:9} {m['error'][:60]}")
                    continue
                shown = f"{ratio:9.3f}" if ratio is not None else f"{'':9}"
                print(f"{seqlen:6} {int(causal):6} {feature:10} {direction:9} {m['tflops']:8.1f} {shown}")
            harness.release_cached_memory()
    return 0


if __name__ == "__main__":
    sys.exit(main())
