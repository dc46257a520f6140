// cupyflash.apply_rotary: the rotary embedding of (batch, seqlen, heads, headdim) rows, or packed
// (total, heads, headdim) rows of cu_seqlens' sequences, in one pass (cupyflash/_rotary.py is the NumPy
// twin and states the definition). Row t of sequence b sits at position offset_b + t; each pair (x1, x2)
// of its first rotary_dim columns, (c, c + rotary_dim / 2) or interleaved (2c, 2c + 1), becomes
// (x1 cos - x2 sin, x1 sin + x2 cos) at column c of the tables (sin negated to rotate back), computed in
// acc_t<T> and rounded once. With copy_rest the columns from rotary_dim on are copied to out (out is not
// x); in place they are left alone.
//
// One thread per pair (consecutive threads: consecutive pairs of one row, so a warp's loads coalesce),
// then one per copied column, in a grid-stride loop. A position outside the tables (an offset array the
// host did not read) makes the pair NaN.
#include "common/dtypes.cuh"
#include "common/math.cuh"
#include "common/params.cuh"

namespace cupyflash {

struct RotaryArgs {
    TensorArg x, out;            // packed: batch_stride 0, rows counted from the start of the tensor
    const void* cos;             // (rows, rotary_dim / 2) contiguous, of type C
    const void* sin;
    const int* cu_seqlens;       // packed: batch + 1 row offsets; null: dense
    const int* offsets;          // (batch,) first positions; null: offset for every sequence
    long long rows;              // rows of x: batch * seqlen, or total
    int offset;
    int batch, seqlen;           // dense: the two leading axes; packed: sequences, 0
    int heads, headdim, half;    // half = rotary_dim / 2
    int table_rows;
    int interleaved, conjugate, copy_rest;
};

// The tables' storage type: x's dtype, or float32 (kFloat32Tables).
template <typename T, bool kFloat32Tables> struct RotaryTable { using type = T; };
template <typename T> struct RotaryTable<T, true> { using type = float; };

template <typename T, bool kFloat32Tables>
__global__ void __launch_bounds__(256) rotary_apply(const CUPYFLASH_GRID_CONSTANT RotaryArgs a) {
    using Acc = acc_t<T>;
    using C = typename RotaryTable<T, kFloat32Tables>::type;
    const int rest = a.copy_rest ? a.headdim - 2 * a.half : 0;
    const int per_head = a.half + rest;  // pairs, then copied columns
    const long long work = a.rows * a.heads * per_head;
    for (long long w = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; w < work;
         w += static_cast<long long>(gridDim.x) * blockDim.x) {
        const int item = static_cast<int>(w % per_head);
        const long long row_head = w / per_head;
        const int h = static_cast<int>(row_head % a.heads);
        const long long r = row_head / a.heads;
        long long x_at, out_at;
        int b, t;
        if (a.cu_seqlens == nullptr) {
            b = static_cast<int>(r / a.seqlen);
            t = static_cast<int>(r % a.seqlen);
            x_at = b * a.x.batch_stride + t * a.x.row_stride + h * a.x.head_stride;
            out_at = b * a.out.batch_stride + t * a.out.row_stride + h * a.out.head_stride;
        } else {
            int lo = 0, hi = a.batch;  // the sequence holding row r: cu[lo] <= r < cu[lo + 1]
            while (hi - lo > 1) {
                const int mid = (lo + hi) / 2;
                if (a.cu_seqlens[mid] <= r) lo = mid; else hi = mid;
            }
            b = lo;
            t = static_cast<int>(r - a.cu_seqlens[b]);
            x_at = r * a.x.row_stride + h * a.x.head_stride;
            out_at = r * a.out.row_stride + h * a.out.head_stride;
        }
        const T* x = static_cast<const T*>(a.x.ptr) + x_at;
        T* out = static_cast<T*>(a.out.ptr) + out_at;
        if (item >= a.half) {  // a column past rotary_dim, copied
            const int c = 2 * a.half + item - a.half;
            out[c] = x[c];
            continue;
        }
        const int c = item;
        const int first = a.interleaved ? 2 * c : c;
        const int second = a.interleaved ? 2 * c + 1 : c + a.half;
        const long long position = static_cast<long long>(a.offsets != nullptr ? a.offsets[b] : a.offset) + t;
        Acc cs = Consts<Acc>::nan(), sn = Consts<Acc>::nan();
        if (position >= 0 && position < a.table_rows) {
            cs = static_cast<Acc>(to_acc(static_cast<const C*>(a.cos)[position * a.half + c]));
            sn = static_cast<Acc>(to_acc(static_cast<const C*>(a.sin)[position * a.half + c]));
        }
        if (a.conjugate) sn = -sn;
        const Acc x1 = to_acc(x[first]), x2 = to_acc(x[second]);
        out[first] = from_acc<T>(x1 * cs - x2 * sn);
        out[second] = from_acc<T>(x1 * sn + x2 * cs);
    }
}

}  // namespace cupyflash
