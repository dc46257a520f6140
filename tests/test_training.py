"""Attention sinks, dropout and the per-head maximum score on the NumPy path: the generator against
Random123's known answers and a scalar transcription of its documented definition, the keep mask's
statistics, every feature against the float64 oracle with the tolerance rule (odd shapes, GQA, causal,
windows, packed batches, every dtype), the oracle's own gradients against central differences, and the
checks of the new arguments."""

import shutil
import subprocess

import numpy as np
import pytest
from helpers import DTYPES, central_differences, check_dense, check_varlen, random_qkv

import cupyflash
from cupyflash import _dropout, _kernels, reference

pytestmark = pytest.mark.filterwarnings("error")


# --- the generator ------------------------------------------------------------------------------------

#: Random123's kat_vectors for Philox4x32-10: (counter, key, output).
_KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter, key, expected", _KNOWN_ANSWERS)
def test_philox_known_answers(counter, key, expected):
    """The round function against Random123's answers (published for ten rounds; dropout draws seven)."""
    assert tuple(int(w) for w in _dropout.philox4x32(*counter, *key, rounds=10)) == expected
    assert _scalar_philox(counter, key, rounds=10) == list(expected)


def _scalar_philox(counter, key, rounds=7):
    """Philox4x32 on Python ints, one call, written from the paper's round function."""
    c = list(counter)
    k0, k1 = key
    for _ in range(rounds):
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k0, p1 & 0xFFFFFFFF, (p0 >> 32) ^ c[3] ^ k1, p0 & 0xFFFFFFFF]
        k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
    return c


def _scalar_keep(seed, offset, b, h, heads, i, j, p):
    """The keep decision of one entry, transcribed from cupyflash/_dropout.py's definition."""
    row, col = (i >> 4) * 8 + i % 8, (j >> 5) * 4 + (j >> 1) % 4
    words = _scalar_philox((row, col, b * heads + h, offset), (seed % 2**32, seed >> 32))
    word = words[2 * ((i >> 3) & 1) + ((j >> 4) & 1)]
    threshold = max(1, int(p * 256 + 0.5))  # these p: 256 p is no tie, and below 255
    return (word >> (8 * (2 * ((j >> 3) & 1) + (j & 1)))) & 0xFF >= threshold


@pytest.mark.parametrize("seed, offset, p", [(0, 0, 0.5), (2**64 - 1, 2**32 - 1, 0.1), (123456789012345, 77, 0.9)])
def test_dropout_mask_is_its_definition(seed, offset, p):
    """Every entry of an odd-sized mask against the scalar transcription (rows past 16 and columns past
    32, so the folds of bit 3 and bits 3 and 4 and the word and byte choices are exercised)."""
    shape = (2, 3, 37, 45)
    mask = cupyflash.dropout_mask(seed, shape, p, offset)
    assert mask.shape == shape and mask.dtype == bool
    expected = np.array([_scalar_keep(seed, offset, b, h, 3, i, j, p) for b, h, i, j in np.ndindex(shape)])
    np.testing.assert_array_equal(mask.reshape(-1), expected)


def _host_build(tmp_path, name, program):
    """``program`` built as host C++ against kernels_cu/ (device qualifiers defined away); skips the test
    without a host compiler. Returns the binary's path."""
    compiler = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip("no host C++ compiler")
    source = tmp_path / f"{name}.cpp"
    source.write_text(program)
    binary = tmp_path / name
    subprocess.run([compiler, "-std=c++17", "-O1", "-D__device__=", "-D__forceinline__=inline", "-I",
                    _kernels.kernel_dir(), str(source), "-o", str(binary)], check=True, capture_output=True)
    return str(binary)


_HOST_PROGRAM = r"""
#include <cstdio>
#include <cstdlib>
#include "common/dropout.cuh"
int main(int argc, char** argv) {
    cupyflash::DropoutArg d{strtoull(argv[1], nullptr, 10), static_cast<unsigned>(strtoul(argv[2], nullptr, 10)),
                            static_cast<unsigned>(strtoul(argv[3], nullptr, 10)), 1.0, 1};
    const int batch = atoi(argv[4]), heads = atoi(argv[5]), rows = atoi(argv[6]), cols = atoi(argv[7]);
    for (int b = 0; b < batch; ++b)
        for (int h = 0; h < heads; ++h)
            for (int i = 0; i < rows; ++i)
                for (int j = 0; j < cols; ++j) putchar(cupyflash::dropout_keep(d, b * heads + h, i, j) ? '1' : '0');
    return 0;
}
"""


def test_kernel_header_is_the_definition_on_the_host(tmp_path):
    """kernels_cu/common/dropout.cuh, built as host C++ (it is host/device code), against the Python
    definition bit for bit (tests/test_gpu_training.py checks the device build)."""
    binary = _host_build(tmp_path, "keep", _HOST_PROGRAM)
    seed, offset, p, shape = 2**63 + 12345, 4000000000, 0.37, (2, 3, 45, 33)
    run = subprocess.run([binary, str(seed), str(offset), str(_dropout.threshold(p)), *map(str, shape)],
                         check=True, capture_output=True, text=True)
    got = np.frombuffer(run.stdout.encode(), np.uint8).reshape(shape) == ord("1")
    np.testing.assert_array_equal(got, cupyflash.dropout_mask(seed, shape, p, offset))


_FRAGMENT_PROGRAM = r"""
#include <cstdio>
#include <cstdlib>
#include "fragment/dropout.cuh"
// Every thread of a warp's 16-row fragment of NT n-tiles, packed as the A operand of NT / 2 k-steps (lane:
// rows row0 + lane / 4 and + 8, keys n0 + 8 nt + 2 (lane % 4) + {0, 1}; pairs of bfloat16 ones) drops its
// probabilities; prints the kept mask of rows row0 .. row0 + 15, keys n0 .. n0 + 8 NT - 1.
int main(int argc, char** argv) {
    cupyflash::DropoutArg d{strtoull(argv[1], nullptr, 10), static_cast<unsigned>(strtoul(argv[2], nullptr, 10)),
                            static_cast<unsigned>(strtoul(argv[3], nullptr, 10)), 1.0, 1};
    const unsigned bh = strtoul(argv[4], nullptr, 10);
    const int row0 = atoi(argv[5]), n0 = atoi(argv[6]);
    char kept[16][8 * NT];
    for (int lane = 0; lane < 32; ++lane) {
        unsigned a[NT / 2][4];
        for (auto& step : a) for (unsigned& x : step) x = 0x3F803F80u;
        const int col_t = 2 * (lane % 4);
        cupyflash::drop_operand(a, d, bh, row0 + lane / 4, n0, col_t);
        for (int kk = 0; kk < NT / 2; ++kk)
            for (int r = 0; r < 4; ++r)
                for (int e = 0; e < 2; ++e) {
                    const unsigned half = (a[kk][r] >> (16 * e)) & 0xFFFFu;
                    if (half != 0 && half != 0x3F80u) return 1;
                    kept[lane / 4 + 8 * (r % 2)][16 * kk + 8 * (r / 2) + col_t + e] = half ? '1' : '0';
                }
    }
    for (auto& line : kept) fwrite(line, 1, 8 * NT, stdout);
    return 0;
}
"""


_TRANSPOSED_PROGRAM = r"""
#include <cstdio>
#include <cstdlib>
#include "fragment/dropout.cuh"
// A warp's transposed fragment of NT n-tiles (lane: keys key0 + lane / 4 and + 8, queries m0 + 8 nt + 2 (lane %
// 4) + {0, 1}); prints the kept mask of queries m0 .. m0 + 8 NT - 1 (rows) by keys key0 .. key0 + 15.
int main(int argc, char** argv) {
    cupyflash::DropoutArg d{strtoull(argv[1], nullptr, 10), static_cast<unsigned>(strtoul(argv[2], nullptr, 10)),
                            static_cast<unsigned>(strtoul(argv[3], nullptr, 10)), 1.0, 1};
    const unsigned bh = strtoul(argv[4], nullptr, 10);
    const int key0 = atoi(argv[5]), m0 = atoi(argv[6]);
    char kept[8 * NT][16];
    for (int lane = 0; lane < 32; ++lane) {
        float p[NT][4];
        for (auto& tile : p) for (float& x : tile) x = 1.0f;
        const int key = key0 + lane / 4, col_t = 2 * (lane % 4);
        // The partner lane (4 apart: key ^ 1) sends its pair draw, as the shuffle does on the device.
        const auto partner = [&](unsigned, int block) {
            return cupyflash::dropout_pair_draw(d, bh, key ^ 1, m0 + 16 * block + col_t);
        };
        cupyflash::apply_dropout_transposed(p, cupyflash::dropout_bits_transposed<NT>(d, bh, key, m0, col_t, partner),
                                            1.0f);
        for (int nt = 0; nt < NT; ++nt)
            for (int e = 0; e < 4; ++e) kept[8 * nt + col_t + e % 2][lane / 4 + 8 * (e / 2)] = p[nt][e] != 0.0f ? '1' : '0';
    }
    for (auto& line : kept) fwrite(line, 1, 16, stdout);
    return 0;
}
"""


@pytest.mark.parametrize("n_tiles", [8, 10, 16])
def test_fragment_dropout_is_the_definition_on_the_host(tmp_path, n_tiles):
    """fragment/dropout.cuh (the tensor-core kernels' per-thread draws) as host C++: a warp's packed
    probabilities of 16 rows by 8 n_tiles keys (rows on a multiple of 16, as the kernels' are; 32-key
    calls, and 16-key k-steps that each draw half a call when their count is odd: 80-key tiles start on
    multiples of 16), and the backward's transposed fragment of 16 keys by 8 n_tiles queries, against the
    definition; 4, 5 and 8 16-key blocks (8 fill the backward's 64-bit mask)."""
    keys = 8 * n_tiles
    binary = _host_build(tmp_path, "fragment", f"#define NT {n_tiles}\n" + _FRAGMENT_PROGRAM)
    seed, offset, p, heads = 987654321987, 31, 0.45, 6
    starts = (0, 80, 160, 1040) if n_tiles % 4 else (0, 128, 96, 1024)  # odd k-steps: 80-key tiles' starts
    for (b, h, row0), n0 in zip(((0, 0, 0), (1, 5, 48), (0, 3, 16), (2, 1, 992)), starts):
        run = subprocess.run([binary, str(seed), str(offset), str(_dropout.threshold(p)), str(b * heads + h),
                              str(row0), str(n0)], check=True, capture_output=True, text=True)
        got = np.frombuffer(run.stdout.encode(), np.uint8).reshape(16, keys) == ord("1")
        want = _dropout.keep(seed, offset, b * heads + h, (row0, row0 + 16), (n0, n0 + keys), p)
        np.testing.assert_array_equal(got, want, err_msg=f"rows from {row0}, keys from {n0}")
    # The backward's transposed fragments: keys as rows, queries as columns.
    binary = _host_build(tmp_path, "transposed", f"#define NT {n_tiles}\n" + _TRANSPOSED_PROGRAM)
    for b, h, key0, m0 in ((0, 0, 0, 0), (1, 5, 48, 128), (0, 3, 16, 64), (2, 1, 992, 16), (1, 2, 1040, 48)):
        run = subprocess.run([binary, str(seed), str(offset), str(_dropout.threshold(p)), str(b * heads + h),
                              str(key0), str(m0)], check=True, capture_output=True, text=True)
        got = np.frombuffer(run.stdout.encode(), np.uint8).reshape(keys, 16) == ord("1")
        want = _dropout.keep(seed, offset, b * heads + h, (m0, m0 + keys), (key0, key0 + 16), p)
        np.testing.assert_array_equal(got, want, err_msg=f"keys from {key0}, queries from {m0}")


_MAX_SCORE_PROGRAM = r"""
#include <cstdio>
#include <cstdlib>
#include <cstring>
inline int __float_as_int(float x) { int i; std::memcpy(&i, &x, 4); return i; }
inline float __int_as_float(int i) { float x; std::memcpy(&x, &i, 4); return x; }
inline unsigned atomicMax(unsigned* slot, unsigned x) { unsigned old = *slot; *slot = old > x ? old : x; return old; }
#include "common/max_score.cuh"
int main(int argc, char** argv) {
    for (int k = 1; k < argc; ++k) {
        const unsigned image = cupyflash::max_score_image(strtof(argv[k], nullptr));
        printf("%u %a\n", image, cupyflash::max_score_value(image));
    }
    return 0;
}
"""


def test_max_score_images_order_like_the_floats(tmp_path):
    """common/max_score.cuh's images (built as host C++) order as the floats do, -inf at 0 (a zeroed
    buffer) and NaN above +inf, and decode back to the floats (max_score_value)."""
    binary = _host_build(tmp_path, "image", _MAX_SCORE_PROGRAM)
    values = ["-inf", "-3.4e38", "-1", "-1e-40", "-0", "0", "1e-40", "2.5", "3.4e38", "inf", "nan", "-nan"]
    run = subprocess.run([binary, *values], check=True, capture_output=True, text=True)
    lines = [line.split() for line in run.stdout.splitlines()]
    images = np.array([int(image) for image, _ in lines], np.uint32)
    assert images[0] == 0 and (np.diff(images[:11].astype(np.int64)) > 0).all() and images[11] == images[10]
    decoded = np.array([float.fromhex(value) if "nan" not in value else np.nan for _, value in lines], np.float32)
    expected = np.array([float(x) for x in values], np.float32)
    np.testing.assert_array_equal(decoded[:10].view(np.uint32), expected[:10].view(np.uint32))
    assert np.isnan(decoded[10:]).all()


def test_dropout_mask_statistics():
    """Keep rate within 4 sigma over 2^21 entries, at three rates (none a multiple of 1/256: the rate is
    1 - round(256 p) / 256); no correlation (|r| < 4 / sqrt(n)) between neighbours in i, in j, across the
    partners that share a generator call (j ^ 1, bit 3 of i, bits 3 and 4 of j), across heads and
    offsets."""
    for p in (0.1, 0.5017, 0.83):
        mask = cupyflash.dropout_mask(2024, (1, 2, 1024, 1024), p, offset=3)
        n = mask.size
        rate = cupyflash.dropout_rate(p)
        assert abs(mask.mean() - (1 - rate)) < 4 * np.sqrt(rate * (1 - rate) / n), p
        x = mask.astype(np.float64)
        other = cupyflash.dropout_mask(2024, (1, 2, 1024, 1024), p, offset=4).astype(np.float64)
        pairs = {
            "j+1": (x[..., :-1], x[..., 1:]),
            "j^1": (x[..., 0:1024:2], x[..., 1:1024:2]),
            "i+1": (x[..., :-1, :], x[..., 1:, :]),
            "j^8": (x[..., 0:1024:16], x[..., 8:1024:16]),
            "j^16": (x[..., 0:1024:32], x[..., 16:1024:32]),
            "j^24": (x[..., 0:1024:32], x[..., 24:1024:32]),
            "i^8": (x[..., 0:1024:16, :], x[..., 8:1024:16, :]),
            "i^8,j^8": (x[..., 0:1024:16, 0:1024:16], x[..., 8:1024:16, 8:1024:16]),
            "head": (x[:, 0], x[:, 1]),
            "offset": (x, other),
        }
        for name, (a, b) in pairs.items():
            r = np.corrcoef(a.reshape(-1), b.reshape(-1))[0, 1]
            assert abs(r) < 4 / np.sqrt(a.size), (p, name, r)


def test_dropout_mask_edges():
    assert cupyflash.dropout_mask(1, (2, 2, 5, 0), 0.5).shape == (2, 2, 5, 0)
    assert cupyflash.dropout_mask(None, (1, 1, 3, 3), 0.0).all()  # no dropout: every entry kept
    # Entries depend on (b, h, i, j) only: a larger mask holds the smaller one.
    big = cupyflash.dropout_mask(9, (3, 4, 50, 40), 0.3)
    np.testing.assert_array_equal(big[:2, :4, :33, :17], cupyflash.dropout_mask(9, (2, 4, 33, 17), 0.3)[:, :, :, :])
    with pytest.raises(TypeError, match="shape"):
        cupyflash.dropout_mask(1, (2, 2, 5), 0.5)
    with pytest.raises(ValueError, match="dropout_p"):
        cupyflash.dropout_mask(1, (1, 1, 2, 2), 1.0)


def test_dropout_rate():
    """The drop probability the 8-bit decisions give: round(256 p) / 256, halves up, for p = 0 or in
    [1/512, 511/512) (1/256 to 255/256); the arguments checked as the attention functions check
    dropout_p, which refuse the rest."""
    assert cupyflash.dropout_rate(0.0) == 0.0
    assert cupyflash.dropout_rate(0.1) == 26 / 256
    assert cupyflash.dropout_rate(3 / 512) == 2 / 256 and cupyflash.dropout_rate(5 / 512) == 3 / 256
    assert cupyflash.dropout_rate(1 / 512) == 1 / 256
    assert cupyflash.dropout_rate(np.nextafter(511 / 512, 0)) == 255 / 256
    assert cupyflash.dropout_rate(np.float32(0.25)) == 0.25
    for p in (1e-12, np.nextafter(1 / 512, 0), 511 / 512, 0.9999):
        with pytest.raises(ValueError, match=r"dropout_p must be 0 or in \[1/512, 511/512\)"):
            cupyflash.dropout_rate(p)
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\)"):
        cupyflash.dropout_rate(1.0)
    with pytest.raises(TypeError, match="dropout_p must be a real number"):
        cupyflash.dropout_rate(True)


def test_dropout_keeps_the_expectation():
    """With v = 1 every output is the row's kept probabilities times the scale: over 4096 rows of 2048
    keys their mean is 1 within 4 sigma at dropout_p = 0.9 (rate 230/256, scale 256/26), where scaling
    by 1 / (1 - dropout_p) would put it at 1.0156, about 8 sigma off."""
    rng = np.random.default_rng(3)
    q, k = rng.standard_normal((1, 512, 8, 16)), rng.standard_normal((1, 2048, 8, 16))
    out = cupyflash.flash_attention(q, k, np.ones((1, 2048, 8, 16)), dropout_p=0.9, dropout_seed=17)
    rows = out[..., 0].reshape(-1)
    np.testing.assert_array_equal(out, np.broadcast_to(out[..., :1], out.shape))
    assert abs(rows.mean() - 1) < 4 * rows.std() / np.sqrt(rows.size), (rows.mean(), rows.std())


# --- the features against the oracle -----------------------------------------------------------------

def _sinks(heads, seed, with_minus_inf=False):
    sinks = np.random.default_rng(seed).standard_normal(heads).astype(np.float32) * 2
    if with_minus_inf:
        sinks[0] = -np.inf
    return sinks


#: dsinks sums a head's rows into one number, so the rule's max over heads needs several heads to mean
#: anything (with two, the plain baseline's one value can land within a hundredth of an ulp).
_DENSE = [
    # (batch, seqlen_q, seqlen_k, heads, heads_k, headdim, headdim_v), causal, window
    ((2, 37, 45, 4, 2, 16, 16), False, (-1, -1)),
    ((1, 70, 33, 6, 3, 8, 12), True, (-1, -1)),  # rows that see no key
    ((2, 19, 64, 6, 2, 24, 24), False, (5, 3)),
    ((1, 1, 131, 4, 1, 32, 32), True, (-1, -1)),
]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("case", _DENSE, ids=lambda c: f"{c[0]}-causal{int(c[1])}-w{c[2][0]}_{c[2][1]}")
@pytest.mark.parametrize("feature", ["sinks", "dropout", "both"])
def test_dense(feature, case, dtype):
    sizes, causal, window = case
    options = {"window_size": window}
    if feature in ("sinks", "both"):
        options["sinks"] = _sinks(sizes[3], sizes[1], with_minus_inf=feature == "both")
    if feature in ("dropout", "both"):
        options.update(dropout_p=0.17 if feature == "dropout" else 0.5, dropout_seed=2**40 + sizes[1],
                       dropout_offset=sizes[2])
    if feature == "both":
        options["softcap"] = 3.0
    check_dense(np, sizes, DTYPES[dtype], causal=causal, **options)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen(causal, dtype):
    """Packed sequences (one without queries, one without keys): the dropout draws of sequence b are
    batch entry b's, counted from its first row."""
    options = {"sinks": _sinks(4, 3), "dropout_p": 0.25, "dropout_seed": 11, "dropout_offset": 2}
    check_varlen(np, [17, 0, 40, 9], [23, 5, 40, 0], 4, 2, 16, 16, DTYPES[dtype], causal=causal, **options)


def test_no_key_rows_with_sinks():
    """A row that sees no key: out 0, lse the sink (or -inf for a -inf sink), dq 0; the maximum score -inf."""
    q, k, v = random_qkv(np, 1, 6, 2, 2, 2, 8, 8, np.float32, seed=5)
    sinks = np.array([1.5, -np.inf], np.float32)
    out, lse, top = cupyflash.flash_attention(q, k, v, causal=True, sinks=sinks, return_lse=True,
                                              return_max_score=True)
    # causal with seqlen_q 6 > seqlen_k 2: rows 0-3 see no key.
    assert (out[:, :4] == 0).all()
    np.testing.assert_array_equal(lse[0, 0, :4], [1.5] * 4)
    np.testing.assert_array_equal(lse[0, 1, :4], [-np.inf] * 4)
    assert np.isfinite(top).all()
    empty = cupyflash.flash_attention(q, k[:, :0], v[:, :0], sinks=sinks, return_lse=True, return_max_score=True)
    assert (empty[0] == 0).all() and (empty[1][0, 0] == 1.5).all() and (empty[2] == -np.inf).all()
    dout = np.ones_like(out)
    dq, dk, dv, dsinks = cupyflash.flash_attention_backward(dout, q, k, v, out, lse, causal=True, sinks=sinks)
    assert (dq[:, :4] == 0).all() and dsinks.dtype == np.float32 and dsinks[1] == 0


def test_max_score_marks_nan_and_hidden_heads():
    q, k, v = random_qkv(np, 2, 9, 12, 2, 2, 8, 8, np.float64, seed=8)
    q[1, 3, 0, 0] = np.nan
    layout = np.ones((2, 2, 1, 1), bool)
    layout[0, 1] = False  # head 1 of entry 0 sees nothing
    mask = cupyflash.BlockMask.from_dense(layout, (16, 16))
    _, top = cupyflash.flash_attention(q, k, v, block_mask=mask, return_max_score=True)
    assert top.shape == (2, 2) and top.dtype == np.float32
    assert np.isnan(top[1, 0]) and top[0, 1] == -np.inf and np.isfinite(top[[0, 1], [0, 1]]).all()


def test_dropout_reproducible_and_regenerated():
    """Same arguments, same bits; another offset or seed, other draws; dropout 0 with a seed is no dropout."""
    q, k, v = random_qkv(np, 1, 40, 40, 2, 1, 16, 16, np.float32, seed=1)
    run = lambda **o: cupyflash.flash_attention(q, k, v, causal=True, **o)  # noqa: E731
    a, b = run(dropout_p=0.3, dropout_seed=5), run(dropout_p=0.3, dropout_seed=5)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, run(dropout_p=0.3, dropout_seed=5, dropout_offset=1))
    assert not np.array_equal(a, run(dropout_p=0.3, dropout_seed=6))
    np.testing.assert_array_equal(run(dropout_p=0.0, dropout_seed=5), run())


def test_vjp_returns_dsinks():
    q, k, v = random_qkv(np, 1, 20, 30, 4, 2, 8, 8, np.float32, seed=3)
    sinks = _sinks(4, 1)
    dout = np.random.default_rng(0).standard_normal((1, 20, 4, 8)).astype(np.float32)
    options = {"causal": True, "sinks": sinks, "dropout_p": 0.2, "dropout_seed": 4}
    out, vjp = cupyflash.flash_attention_vjp(q, k, v, **options)
    grads = vjp(dout)
    out2, lse = cupyflash.flash_attention(q, k, v, return_lse=True, **options)
    expected = cupyflash.flash_attention_backward(dout, q, k, v, out2, lse, **options)
    assert len(grads) == 4
    for got, want in zip((out, *grads), (out2, *expected)):
        np.testing.assert_array_equal(got, want)


# --- the oracle's own gradients -----------------------------------------------------------------------

def test_oracle_gradients_against_central_differences():
    """The float64 reference's dq, dk, dv and dsinks with sinks, dropout and a softcap, against central
    differences of its forward (the backward formulas are derived, not checked elsewhere)."""
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal(shape) for shape in ((1, 5, 2, 3), (1, 7, 1, 3), (1, 7, 1, 2)))
    sinks = rng.standard_normal(2)
    dout = rng.standard_normal((1, 5, 2, 2))
    keep = cupyflash.dropout_mask(3, (1, 2, 5, 7), 0.4)
    options = {"causal": True, "softcap": 2.0, "dropout_p": 0.4, "dropout_mask": keep}

    def loss():
        return float((reference.attention(q, k, v, sinks=sinks, **options)[0] * dout).sum())

    grads = reference.attention_backward(dout, q, k, v, sinks=sinks, **options)
    for got, x in zip(grads, (q, k, v, sinks)):
        np.testing.assert_allclose(got, central_differences(loss, x, 1e-6), rtol=1e-6, atol=1e-8)


# --- argument checks ----------------------------------------------------------------------------------

@pytest.mark.parametrize("options, error, match", [
    ({"dropout_p": 1.0, "dropout_seed": 1}, ValueError, r"dropout_p must be in \[0, 1\)"),
    ({"dropout_p": -0.1, "dropout_seed": 1}, ValueError, "dropout_p must be in"),
    ({"dropout_p": 1e-3, "dropout_seed": 1}, ValueError, r"dropout_p must be 0 or in \[1/512, 511/512\)"),
    ({"dropout_p": True, "dropout_seed": 1}, TypeError, "dropout_p must be a real number"),
    ({"dropout_p": 0.1}, ValueError, "needs dropout_seed"),
    ({"dropout_p": 0.1, "dropout_seed": -1}, ValueError, r"dropout_seed must be in \[0, 2\*\*64\)"),
    ({"dropout_p": 0.1, "dropout_seed": 2**64}, ValueError, "dropout_seed must be in"),
    ({"dropout_p": 0.1, "dropout_seed": 1.0}, TypeError, "dropout_seed must be an int"),
    ({"dropout_p": 0.1, "dropout_seed": 1, "dropout_offset": 2**32}, ValueError, "dropout_offset must be in"),
    ({"dropout_offset": "1"}, TypeError, "dropout_offset must be an int"),
    ({"sinks": np.zeros(3, np.float32)}, ValueError, r"sinks must have shape \(4,\)"),
    ({"sinks": np.zeros(4, np.float64)}, TypeError, "sinks has dtype float64; expected float32"),
    ({"sinks": [0.0] * 4}, TypeError, "sinks must be a cupy.ndarray or numpy.ndarray"),
    ({"sinks": np.array([0, np.nan, 0, 0], np.float32)}, ValueError, "sinks must be finite or -inf"),
    ({"sinks": np.array([0, 0, np.inf, 0], np.float32)}, ValueError, "got inf at index 2"),
    ({"return_max_score": 1}, TypeError, "return_max_score must be a bool"),
])
def test_argument_checks(options, error, match):
    q, k, v = random_qkv(np, 1, 8, 8, 4, 2, 8, 8, np.float32, seed=0)
    with pytest.raises(error, match=match):
        cupyflash.flash_attention(q, k, v, **options)
    backward_options = {name: value for name, value in options.items() if name != "return_max_score"}
    if backward_options:
        out, lse = cupyflash.flash_attention(q, k, v, return_lse=True)
        with pytest.raises(error, match=match):
            cupyflash.flash_attention_backward(out, q, k, v, out, lse, **backward_options)


def test_kvcache_refuses_dropout():
    """Dropout is for training: the KV-cache call has no such argument (TypeError names it)."""
    q, k, v = random_qkv(np, 1, 1, 8, 2, 2, 8, 8, np.float32, seed=0)
    with pytest.raises(TypeError, match="dropout_p"):
        cupyflash.flash_attention_with_kvcache(q, k, v, dropout_p=0.1)


def test_big_endian_sinks_are_read_natively():
    q, k, v = random_qkv(np, 1, 8, 8, 2, 2, 8, 8, np.float32, seed=0)
    sinks = np.array([0.5, -1.0], np.float32)
    expected = cupyflash.flash_attention(q, k, v, sinks=sinks)
    np.testing.assert_array_equal(cupyflash.flash_attention(q, k, v, sinks=sinks.astype(">f4")), expected)


_POLY_EXP2_PROGRAM = r"""
#include <cmath>
#include <cstdio>
#include <cstring>
inline int __float_as_int(float x) { int i; std::memcpy(&i, &x, 4); return i; }
inline float __int_as_float(int i) { float x; std::memcpy(&x, &i, 4); return x; }
#include "common/poly_exp2.cuh"
int main() {
    double worst2 = 0, worst3 = 0;
    for (int i = 0; i <= 2000000; ++i) {
        const float x = -126.0f + 134.0f * static_cast<float>(i) / 2000000.0f;  // the softmax's range: -126 .. 8
        const double want = std::exp2(static_cast<double>(x));
        worst2 = std::fmax(worst2, std::fabs(cupyflash::poly_exp2<2>(x) - want) / want);
        worst3 = std::fmax(worst3, std::fabs(cupyflash::poly_exp2<3>(x) - want) / want);
    }
    printf("%.3e %.3e %g %g %g\n", worst2, worst3, cupyflash::poly_exp2<3>(-INFINITY), cupyflash::poly_exp2<3>(NAN),
           cupyflash::poly_exp2<2>(-300.0f));
    return 0;
}
"""


def test_polynomial_exp2_is_as_accurate_as_its_comment_says(tmp_path):
    """common/poly_exp2.cuh (built as host C++): relative error below 2.1e-3 (degree 2) and 8.6e-5 (degree
    3) over the softmax's arguments, 0 for -inf and below -127, NaN for NaN."""
    import shutil
    import subprocess
    from pathlib import Path

    compiler = shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        pytest.skip("no host C++ compiler")
    source = tmp_path / "poly.cpp"
    source.write_text(_POLY_EXP2_PROGRAM)
    kernels = Path(__file__).resolve().parent.parent / "kernels_cu"
    subprocess.run([compiler, "-std=c++17", "-O1", "-D__device__=", "-D__forceinline__=inline", "-I", str(kernels),
                    str(source), "-o", str(tmp_path / "poly")], check=True)
    worst2, worst3, neg_inf, nan, tiny = subprocess.run([str(tmp_path / "poly")], check=True, capture_output=True,
                                                        text=True).stdout.split()
    assert float(worst2) < 2.1e-3 and float(worst3) < 8.6e-5, (worst2, worst3)
    assert float(neg_inf) == 0 and nan in ("nan", "-nan") and float(tiny) == 0


_EXP64_PROGRAM = r"""
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include "common/exp64.cuh"
// The error of exp_table(x) in ulps of the exact e^x (long double expl as the reference).
static double ulps(double x) {
    const long double want = expl(static_cast<long double>(x));
    const double ulp = std::ldexp(1.0, std::ilogb(static_cast<double>(want)) - 52);
    return static_cast<double>(fabsl(static_cast<long double>(cupyflash::exp_table(x)) - want)) / ulp;
}
int main() {
    double worst = 0, sum = 0;
    const int n = 4000000;
    for (int i = 0; i <= n; ++i) {  // the softmax's range, -707 .. 6, and around 0 densely
        const double x = i % 2 ? -707.0 + 713.0 * i / n : -1.0 + 2.0 * i / n;
        const double e = ulps(x);
        worst = std::fmax(worst, e);
        sum += e;
    }
    for (int j = -65279; j <= 64 * 8; ++j) {  // the table's boundaries (k ln2 / 64 >= -707) and halfway between
        worst = std::fmax(worst, std::fmax(ulps(j * 0.0108304246962491474), ulps((j + 0.5) * 0.0108304246962491474)));
    }
    printf("%.4f %.4f %g %g %g %g %g\n", worst, sum / (n + 1), cupyflash::exp_table(-INFINITY),
           cupyflash::exp_table(NAN), cupyflash::exp_table(-707.5), cupyflash::exp_table(0.0),
           cupyflash::exp_table(-706.9) / std::exp(-706.9));
    return 0;
}
"""


def test_float64_exponential_is_within_its_stated_error(tmp_path):
    """common/exp64.cuh's exp_table (the float64 softmax's exponential), built as host C++: within 1.5 ulps
    of e^x over the softmax's arguments (-707 .. 6, the table's boundaries included; measured 1.28), 0.4
    on average (0.34; CUDA's exp: 1 ulp at most); 0 for -inf and below -707, NaN for NaN, exactly 1 at 0,
    normal just above -707."""
    binary = _host_build(tmp_path, "exp64", _EXP64_PROGRAM)
    worst, mean, neg_inf, nan, below, one, edge = subprocess.run(
        [binary], check=True, capture_output=True, text=True).stdout.split()
    assert float(worst) <= 1.5 and float(mean) < 0.4, (worst, mean)
    assert float(neg_inf) == 0 and nan in ("nan", "-nan") and float(below) == 0 and float(one) == 1
    assert abs(float(edge) - 1) < 1e-15


_LSE_PAIR_PROGRAM = r"""
#include <cmath>
#include <cstdio>
#include <random>
#include "common/lse_pair.cuh"
// The error of lse_pair_difference(s, split_lse(lse)) in ulps of the exact s - lse (long double), over
// lse in -40 .. 120 (small ones, where s - hi rounds, and the Sterbenz range) and s within -30 .. 2 of it.
int main() {
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<double> lse_of(-40.0, 120.0), gap(-30.0, 2.0), tiny(-1e-3, 1e-3);
    double worst = 0, worst_twice = 0;
    for (int i = 0; i < 2000000; ++i) {
        const double lse = i % 4 ? lse_of(rng) : tiny(rng);  // a quarter near 0 (one-key rows of s near 0)
        const float s = static_cast<float>(lse + gap(rng));
        const cupyflash::float2 pair = cupyflash::split_lse(lse);
        const long double exact = static_cast<long double>(s) - static_cast<long double>(lse);
        const float d = cupyflash::lse_pair_difference(s, pair);
        const float twice = (s - pair.x) - pair.y;  // the two roundings it replaces
        const long double ulp = std::ldexp(1.0L, std::ilogb(static_cast<float>(exact)) - 23);
        worst = std::fmax(worst, static_cast<double>(fabsl(d - exact) / ulp));
        worst_twice = std::fmax(worst_twice, static_cast<double>(fabsl(twice - exact) / ulp));
    }
    const cupyflash::float2 none = cupyflash::split_lse(-INFINITY);
    // A score of -inf (a score_mod's mask) against a finite lse, and a finite one against a row with no key.
    const float masked = cupyflash::lse_pair_difference(-INFINITY, cupyflash::split_lse(3.25));
    const float keyless = cupyflash::lse_pair_difference(1.5f, none);
    printf("%.6f %.6f %g %g %g %g\n", worst, worst_twice, none.x, none.y, masked, keyless);
    return 0;
}
"""


def test_lse_pair_difference_rounds_once(tmp_path):
    """common/lse_pair.cuh (the float32 Hopper backward's s - lse from a float pair), built as host C++:
    within half an ulp of the exact s - lse (plus 2^-24 of one), where rounding s - hi and then - lo
    reached a whole ulp; a row without keys (-inf) splits into (+inf, 0); a score of -inf gives -inf (P =
    0), not TwoSum's NaN, and so does any score against a row without keys."""
    binary = _host_build(tmp_path, "lse_pair", _LSE_PAIR_PROGRAM)
    worst, worst_twice, inf, zero, masked, keyless = subprocess.run(
        [binary], check=True, capture_output=True, text=True).stdout.split()
    assert float(worst) <= 0.5 + 2**-20, worst
    assert float(worst_twice) > 0.75, worst_twice  # (the test can tell the two apart)
    assert float(inf) == float("inf") and float(zero) == 0
    assert float(masked) == float("-inf") and float(keyless) == float("-inf"), (masked, keyless)
