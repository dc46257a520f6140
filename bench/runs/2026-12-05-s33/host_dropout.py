"""Host time of a dropout forward and backward against plain ones (training.py's shape, d128 4k, batch 4,
16 heads): where the per-call timing's extra 0.6-1 ms goes (call 1: per call 2.3-3.3x plain, back to back
1.5-1.6x)."""
import cProfile
import pstats
import sys

sys.path.insert(0, "bench")
import harness  # noqa: E402

import cupyflash  # noqa: E402

q, k, v, dout = harness.make_inputs((4, 4096, 16, 128), harness.dtype("bf16"), seed=1)
out, lse = cupyflash.flash_attention(q, k, v, return_lse=True)
calls = {
    "plain fwd": lambda: cupyflash.flash_attention(q, k, v),
    "dropout fwd": lambda: cupyflash.flash_attention(q, k, v, dropout_p=0.1, dropout_seed=1234),
    "plain bwd": lambda: cupyflash.flash_attention_backward(dout, q, k, v, out, lse),
    "dropout bwd": lambda: cupyflash.flash_attention_backward(dout, q, k, v, out, lse, dropout_p=0.1,
                                                              dropout_seed=1234),
}
for name, call in calls.items():
    per_call = sorted(harness.time_per_call(call, 3, 15))[7]
    host = min(harness.host_ms_per_call(call) for _ in range(5))
    print(f"{name:12} per call {per_call:7.3f} ms  host {host * 1e3:7.1f} us", flush=True)
prof = cProfile.Profile()
prof.enable()
for _ in range(20):
    calls["dropout fwd"]()
harness.synchronize()
prof.disable()
pstats.Stats(prof).sort_stats("tottime").print_stats(12)
