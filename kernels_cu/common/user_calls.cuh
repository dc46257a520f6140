// How the kernels call the code generated from a score_mod or mask_mod (cupyflash/_trace.py's
// kernel_source, compiled ahead of the kernel's source): a kernel takes the generated structs UserScore
// and UserMask as template arguments, or NoUserScore and NoUserMask without them, and reads their
// buffers from AttnArgs (score_buffers, mask_buffers). The generated functions are pure and compute
// with the _rn operations of common/user_mod.cuh, so the forward and backward kernels, compiled
// separately, compute bitwise the same modified score (but for the fast forms of 16-bit inputs, which
// agree within their roundings).
#pragma once
#include "common/exact_sum.cuh"
#include "common/math.cuh"
#include "common/params.cuh"
#include "common/score_mod.cuh"
#include "common/sequence.cuh"

namespace cupyflash {

// A if kIf, else B.
template <bool kIf, typename A, typename B>
struct IfType {
    using type = A;
};
template <typename A, typename B>
struct IfType<false, A, B> {
    using type = B;
};

// The template arguments of a kernel built without a score_mod or without a mask_mod.
struct NoUserScore {
    static constexpr bool kEnabled = false;
    static constexpr bool kBufferGradients = false;
    static constexpr bool kGradientsReadScore = false;
    static constexpr bool kAdditive = false;
    static constexpr bool kReadsPositions = false;
    static constexpr bool kFreezable = false;
    static constexpr bool kFast = false;
};
struct NoUserMask {
    static constexpr bool kEnabled = false;
};

// The tiles' pairs outside the sequence (padding rows and keys) take the score 0 and the derivative 0:
// there the function may index past its buffers (a NaN score) or divide by the 0 an out-of-range load
// gives (an infinite derivative), and the padding rows, whose probabilities are 0 only for finite
// scores, and 0 * inf would carry NaN into real rows through the tile products (the NumPy paths never
// see those pairs). Pairs inside the sequence keep theirs, as the NumPy paths do.
struct UserExtent {
    int seqlen_q, seqlen_k;

    UserExtent() = default;
    __device__ __forceinline__ explicit UserExtent(const Sequence& s) : seqlen_q(s.seqlen_q), seqlen_k(s.seqlen_k) {}
    // (Rows before the sequence, which the Hopper forward's first tile of a sequence may hold, too.)
    __device__ __forceinline__ bool inside(int i, int j) const {
        return static_cast<unsigned>(i) < static_cast<unsigned>(seqlen_q) && j < seqlen_k;
    }
};

// The general path's scores with a score_mod, NaturalScores' interface: the scaled score rounded once
// (as NaturalScores rounds it), then the function, whose derivative with respect to the scaled score is
// the backward's grad.
template <typename Acc, typename ScoreFn>
struct UserNaturalScores {
    using Fn = ScoreFn;
    using Float = Acc;
    Acc scale;
    const ModBuffers* buffers;
    int b, h;
    UserExtent extent;

    static constexpr bool kFolded = false;  // (UserLog2Scores::kFolded: the natural-log paths never fold)

    UserNaturalScores() = default;
    __device__ __forceinline__ UserNaturalScores(const AttnArgs& a, const Sequence& seq, int b_, int h_)
        : scale(static_cast<Acc>(a.softmax_scale)), buffers(&a.score_buffers), b(b_), h(h_), extent(seq) {}

    __device__ __forceinline__ Acc modified(Acc x, int i, int j, Acc* grad) const {
        const Acc s = scale_score(x, scale);
        const bool inside = extent.inside(i, j);
        const Acc g = ScoreFn::template dscore<Acc>(s, b, h, i, j, *buffers);
        const Acc v = ScoreFn::template value<Acc>(s, b, h, i, j, *buffers);
        *grad = inside ? g : Acc(0);
        return inside ? v : Acc(0);
    }

    // Whether queries [q0, q1] and keys [k0, k1] lie inside the sequence and the function's parts that
    // read the positions hold one value over them (FrozenScores).
    __device__ __forceinline__ bool uniform(int q0, int q1, int k0, int k1) const {
        return extent.inside(q0, k0) && extent.inside(q1, k1) &&
               ScoreFn::template uniform<Acc>(b, h, q0, q1, k0, k1, *buffers);
    }
};


// The tensor-core paths' scores with a score_mod, Log2Scores' interface (fragment/scores.cuh's
// modify_rows with kScoreMod): the scaled score softmax_scale * x rounded once, the function in float32,
// then LOG2E times it, the base-2 units of fragment/softmax.cuh. The ALiBi bias argument is unused (the
// host refuses ALiBi with a score_mod), and so is the softcap's tanh.
template <typename ScoreFn, bool kFold = false>
struct UserLog2Scores {
    using Fn = ScoreFn;
    using Float = float;
    static constexpr bool kLate = false;  // UserLog2ScoresLate
    float scale;
    float scale_log2;         // softmax_scale * LOG2E (what the unmodified paths read)
    float bias_log2 = 0.0f;   // no ALiBi
    const ModBuffers* buffers;
    int b, h;
    UserExtent extent;

    UserLog2Scores() = default;
    __device__ __forceinline__ UserLog2Scores(const AttnArgs& a, const Sequence& seq, int b_, int h_)
        : scale(static_cast<float>(a.softmax_scale)), scale_log2(static_cast<float>(a.softmax_scale) * kLog2eF),
          buffers(&a.score_buffers), b(b_), h(h_), extent(seq) {}

    // A forward's (kFold) fast forms of an additive function (16-bit inputs), value = s + g(positions):
    // LOG2E (s + g) as one FMA of the raw product, fma(x, scale_log2, LOG2E g), the scale folded as the
    // built-in scores fold it (g is the function at score -0, to which adding -0 changes nothing); a
    // frozen tile takes LOG2E g once (FrozenScores), where the accurate form's scale, add and product cost
    // three instructions an entry. Pair and frozen tile compute it alike, bitwise. The backwards keep the
    // accurate form (folded, the Hopper backward's consumers went from 16 local accesses to 48 with a T5
    // bias), so they recompute the scores within their roundings (a few float32 ulps, far inside a
    // 16-bit gradient's tolerance), as fast forms and the built-in kernels' folded scale already do.
    static constexpr bool kFolded = kFold && ScoreFn::kAdditive && ScoreFn::kFast;

    // (Evaluated everywhere, then selected: a function evaluated under a per-pair branch keeps the compiler
    // from sharing its parts that depend on the head alone across the pairs. Its loads are bounds-checked.)
    __device__ __forceinline__ float modified(float x, int i, int j, float, float* tanh_out) const {
        *tanh_out = 0.0f;
        float v;
        if constexpr (kFolded) {
            v = fmaf(x, scale_log2, ScoreFn::template value<float>(-0.0f, b, h, i, j, *buffers) * kLog2eF);
        } else {
            v = ScoreFn::template value<float>(scale_score(x, scale), b, h, i, j, *buffers) * kLog2eF;
        }
        return extent.inside(i, j) ? v : 0.0f;
    }

    // d(value) / d(scaled score) at the raw product x (Log2Scores::derivative's interface).
    __device__ __forceinline__ float derivative(float x, int i, int j, float) const {
        const float g = ScoreFn::template dscore<float>(scale_score(x, scale), b, h, i, j, *buffers);
        return extent.inside(i, j) ? g : 0.0f;
    }

    // UserNaturalScores::uniform.
    __device__ __forceinline__ bool uniform(int q0, int q1, int k0, int k1) const {
        return extent.inside(q0, k0) && extent.inside(q1, k1) &&
               ScoreFn::template uniform<float>(b, h, q0, q1, k0, k1, *buffers);
    }
};

// UserLog2Scores for rows of several query heads (the decode kernel packs a GQA group's heads into its
// rows): modify_rows' per-row argument is the row's head.
template <typename ScoreFn>
struct UserLog2ScoresByRow {
    float scale;
    const ModBuffers* buffers;
    int b;
    UserExtent extent;

    __device__ __forceinline__ UserLog2ScoresByRow(const AttnArgs& a, const Sequence& seq, int b_)
        : scale(static_cast<float>(a.softmax_scale)), buffers(&a.score_buffers), b(b_), extent(seq) {}

    __device__ __forceinline__ float modified(float x, int i, int j, int h, float* tanh_out) const {
        *tanh_out = 0.0f;
        const float v = ScoreFn::template value<float>(scale_score(x, scale), b, h, i, j, *buffers) * kLog2eF;
        return extent.inside(i, j) ? v : 0.0f;
    }
};

// UserLog2Scores for a backward that takes the score_mod's buffer gradients after the probabilities and
// the mask (fragment/scores.cuh's buffer_gradients_cols): probabilities_cols leaves the derivative out
// (derivative 1), and the function's derivatives, which do not read the score (the host checks), come
// from the positions alone.
template <typename ScoreFn>
struct UserLog2ScoresLate : UserLog2Scores<ScoreFn> {
    static_assert(!ScoreFn::kGradientsReadScore, "the derivatives are taken without the score");
    static constexpr bool kLate = true;
    using UserLog2Scores<ScoreFn>::UserLog2Scores;

    __device__ __forceinline__ float derivative(float, int, int, float) const { return 1.0f; }

    // d(value) / d(score) of pair (i, j).
    __device__ __forceinline__ float derivative_at(int i, int j) const {
        const float g = ScoreFn::template dscore<float>(0.0f, this->b, this->h, i, j, *this->buffers);
        return this->extent.inside(i, j) ? g : 0.0f;
    }

    // ds_mod times d(value) / d(load) into each floating-point buffer element pair (i, j) reads.
    template <typename Sink>
    __device__ __forceinline__ void scatter(float ds_mod, int i, int j, Sink& sink) const {
        ScoreFn::scatter(0.0f, this->b, this->h, i, j, *this->buffers, ds_mod, sink);
    }
};

// The scores of a tile over which Base::uniform holds (a tile inside the sequence where every part of
// the score_mod that reads q_idx or kv_idx holds one value): the parts that do not read the score
// computed once, at (i0, j0) (ScoreFn::freeze: a T5 bias past its clip loads one table entry for the
// tile), and per pair only the rest (ScoreFn::value_frozen: one add). Kernels take it in a branch that
// is uniform over the warp (FreezesScores). (The compiler does not share a per-pair evaluation's loads
// across the pairs by itself: they are guarded.)
template <typename Base>
struct FrozenScores : Base {
    using Fn = typename Base::Fn;
    using F = typename Base::Float;
    static constexpr bool kFolded = Base::kFolded;
    typename Fn::template Frozen<F> fz;

    F folded_log2 = F(0);  // LOG2E g of the fast forms' additive functions (UserLog2Scores::kFolded)

    __device__ __forceinline__ FrozenScores(const Base& base, int i0, int j0)
        : Base(base), fz(Fn::template freeze<F>(base.b, base.h, i0, j0, *base.buffers)) {
        if constexpr (kFolded) folded_log2 = Fn::value_frozen(F(-0.0), fz, *base.buffers) * kLog2eF;
    }

    // UserNaturalScores::modified.
    __device__ __forceinline__ F modified(F x, int, int, F* grad) const {
        const F s = scale_score(x, this->scale);
        *grad = Fn::dscore_frozen(s, fz, *this->buffers);
        return Fn::value_frozen(s, fz, *this->buffers);
    }
    // UserLog2Scores::modified and derivative (UserLog2ScoresLate's derivative: 1), derivative_at, scatter.
    __device__ __forceinline__ float modified(float x, int, int, float, float* tanh_out) const {
        *tanh_out = 0.0f;
        if constexpr (kFolded) {
            return fmaf(x, this->scale_log2, folded_log2);
        } else {
            return Fn::value_frozen(scale_score(x, this->scale), fz, *this->buffers) * kLog2eF;
        }
    }
    __device__ __forceinline__ float derivative(float x, int, int, float) const {
        if constexpr (Base::kLate) {
            return 1.0f;
        } else {
            return Fn::dscore_frozen(scale_score(x, this->scale), fz, *this->buffers);
        }
    }
    __device__ __forceinline__ float derivative_at(int, int) const { return Fn::dscore_frozen(0.0f, fz, *this->buffers); }
    template <typename Sink>
    __device__ __forceinline__ void scatter(float ds_mod, int, int, Sink& sink) const {
        Fn::scatter_frozen(0.0f, fz, *this->buffers, ds_mod, sink);
    }
};

// Whether a kernel's scores object is a FrozenScores, and whether a kernel built for ScoreFn takes the
// frozen branch (a score_mod whose reads of the positions can hold one value over a tile, kFreezable; the
// others compute the same per pair).
template <typename Scores>
struct IsFrozen {
    static constexpr bool value = false;
};
template <typename Base>
struct IsFrozen<FrozenScores<Base>> {
    static constexpr bool value = true;
};
template <typename ScoreFn>
struct FreezesScores {
    static constexpr bool value = ScoreFn::kEnabled && ScoreFn::kFreezable;
};

// A kernel's scores object: its built-in one (Log2Scores, or NaturalScores<Acc> on the natural-log
// paths) without a score_mod; with one, UserLog2Scores or UserNaturalScores<Acc> in its place (kFold: a
// forward's, UserLog2Scores::kFolded).
template <typename ScoreFn, typename Builtin, bool kFold = false>
struct ScoresOf {
    using type = UserLog2Scores<ScoreFn, kFold>;
};
template <typename ScoreFn, typename Acc, bool kFold>
struct ScoresOf<ScoreFn, NaturalScores<Acc>, kFold> {
    using type = UserNaturalScores<Acc, ScoreFn>;
};
template <typename Builtin, bool kFold>
struct ScoresOf<NoUserScore, Builtin, kFold> {
    using type = Builtin;
};
template <typename Acc, bool kFold>
struct ScoresOf<NoUserScore, NaturalScores<Acc>, kFold> {
    using type = NaturalScores<Acc>;
};

// The digits of an exact sum (common/exact_sum.cuh) added with integer atomics, which commute.
struct ExactAtomicWords {
    long long* words;

    __device__ __forceinline__ void add(int k, long long v) {
        atomicAdd(reinterpret_cast<unsigned long long*>(words + k), static_cast<unsigned long long>(v));
    }
    __device__ __forceinline__ void set(int k, long long bits) {
        atomicOr(reinterpret_cast<unsigned long long*>(words + k), static_cast<unsigned long long>(bits));
    }
};

// amount into element `offset` of buffer `buffer`'s gradient: an atomic add into its accumulator of the
// accumulation type, or (ModGrads::exact, the deterministic backward) into its exact sum.
template <typename F>
__device__ __forceinline__ void add_buffer_gradient(const ModGrads& grads, int buffer, long long offset, F amount) {
    if (grads.exact) {
        ExactAtomicWords words{static_cast<long long*>(grads.data[buffer]) + offset * exact_sum_slots<F>()};
        exact_sum_add(amount, words);
    } else {
        atomicAdd(static_cast<F*>(grads.data[buffer]) + offset, amount);
    }
}

// Where the backward adds ds_mod * d(score)/d(load) for the floating-point buffers of a score_mod: one
// atomic add per term (add_buffer_gradient).
struct AtomicBufferGrads {
    const ModGrads* grads;

    template <typename F>
    __device__ __forceinline__ void add(int buffer, long long offset, F amount) {
        add_buffer_gradient(*grads, buffer, offset, amount);
    }
};

// The same with the gradients summed per CTA in shared memory first, where the host gave the kernel room
// for them (ModGrads::local_offset; never in the deterministic backward): shared-memory atomics, which
// do not contend across the GPU, then one add per element into the accumulators when the CTA is done
// (flush). float32 accumulators (16-bit problems).
// A thread's consecutive terms for one element are summed in a register first (a run), so a function
// whose terms pile onto few elements (a clipped relative bias: every pair past the clip reads its end)
// makes one atomic per run, not one per pair: measured on the H200, the T5 bias at 16k spent 1.1 s of
// its 1.14 s backward in shared-memory atomics on those two elements per head (session 25). Not in the
// deterministic backward, whose exact sums take every term as it is.
struct LocalBufferGrads {
    float* local;  // ModGrads::local_offset[kMaxModBuffers] floats of shared memory, zeroed by clear
    const ModGrads* grads;
    int run_buffer = -1;     // the run's element (none: -1)
    unsigned run_offset = 0;
    float run_sum = 0.0f;

    __device__ __forceinline__ void add(int buffer, unsigned offset, float amount) {
        if (grads->exact) {
            add_buffer_gradient(*grads, buffer, offset, amount);
        } else if (buffer == run_buffer && offset == run_offset) {
            run_sum += amount;
        } else {
            commit();
            run_buffer = buffer;
            run_offset = offset;
            run_sum = amount;
        }
    }

    // The run so far into the sums (before the CTA's last barrier).
    __device__ __forceinline__ void commit() {
        if (run_buffer < 0) return;
        if (grads->local_offset[kMaxModBuffers] > 0) {
            atomicAdd(local + grads->local_offset[run_buffer] + run_offset, run_sum);
        } else {
            add_buffer_gradient(*grads, run_buffer, run_offset, run_sum);
        }
        run_buffer = -1;
    }

    // Thread `thread` of `threads` zeroes its share of the sums (the CTA synchronizes before the adds).
    __device__ __forceinline__ void clear(int thread, int threads) const {
        for (int i = thread; i < grads->local_offset[kMaxModBuffers]; i += threads) local[i] = 0.0f;
    }

    // After the CTA's last add and a barrier: the sums into the accumulators (the elements it touched).
    __device__ __forceinline__ void flush(int thread, int threads) const {
        for (int b = 0; b < kMaxModBuffers; ++b) {
            const int first = grads->local_offset[b], count = grads->local_offset[b + 1] - first;
            float* out = static_cast<float*>(grads->data[b]);
            for (int i = thread; i < count; i += threads) {
                const float v = local[first + i];
                if (v != 0.0f) atomicAdd(out + i, v);
            }
        }
    }
};

// The positions a mask_mod sees for batch entry b and query head h: 0 on an axis its BlockMask was built
// for with one entry (the layout's slice stride along it is then 0).
__device__ __forceinline__ int user_mask_batch(const AttnArgs& a, int b) { return a.sparse.slice_batch_stride != 0 ? b : 0; }
__device__ __forceinline__ int user_mask_head(const AttnArgs& a, int h) { return a.sparse.slice_head_stride != 0 ? h : 0; }

// A mask_mod at one (batch entry, query head), for the fragment loops (fragment/scores.cuh's mask_rows):
// the function over a row of a fragment as bits. NoUserMask's has nothing to hold.
template <typename MaskFn, bool kColumnWords = false>
struct UserMaskAt;

// Whether a pair that the window, bounds and block layout show passes the mask_mod, in a tile its lists
// mark partial (tiles whose blocks the function fills are not). A pair where the function reads outside
// a buffer stays visible and its score *s becomes NaN, so the error reaches the rows it touches.
template <typename MaskFn, typename Acc>
__device__ __forceinline__ bool user_mask_visible(const AttnArgs& a, int mb, int mh, int i, int j, Acc* s) {
    bool poisoned;
    const bool visible = MaskFn::visible(mb, mh, i, j, a.mask_buffers, &poisoned);
    if (poisoned) *s = Consts<Acc>::nan();
    return visible;
}

// kColumnWords: a column fragment's bits (the backwards) also come from from_mask_mod's words where it
// kept them, and mask_cols masks a tile inside one block by words (mask_row_words); call sites whose
// registers are spoken for (a score function beside the mask) leave it off.
template <typename MaskFn, bool kColumnWords>
struct UserMaskAt {
    static constexpr bool kEnabled = true;
    static constexpr bool kWords = kColumnWords;
    const AttnArgs* a;
    int b, h;
    // A fragment's words fetched ahead (fetch_slot, fetch_words): kNotFetched, else the slot (-1: the
    // function runs) and the two rows' bits.
    static constexpr int kNotFetched = -2;
    int ahead_slot = kNotFetched;
    unsigned ahead_rows[2] = {0, 0};

    __device__ __forceinline__ UserMaskAt(const AttnArgs& args, int b_, int h_)
        : a(&args), b(user_mask_batch(args, b_)), h(user_mask_head(args, h_)) {}

    // from_words in two steps, for a caller with time between them (the Hopper backward): fetch_slot's
    // load issued before the tile's products, fetch_words' once they are issued, so the two dependent
    // trips to memory run beside the products instead of one after the other in mask_cols, where a
    // ragged document mask's partial tiles waited them out (with mask_cols' layout reads skipped, that
    // backward +3% on an H100; the same in the Hopper forward measured nothing: bench/NOTES.md, session
    // 50). bits() then takes the fetched rows; a caller fetches for every partial tile, in the
    // orientation it masks.
    template <bool kKeyRows, int kNTiles>
    __device__ __forceinline__ void fetch_slot(const int (&fixed)[2], int first) {
        static_assert(!kKeyRows || kColumnWords, "a column fragment's words are read only with kColumnWords");
        WordsAt w;
        ahead_slot = a->sparse.elem_slot != nullptr && words_at<kKeyRows, kNTiles>(fixed, first, &w)
                         ? a->sparse.elem_slot[w.cell]
                         : -1;
    }
    template <bool kKeyRows, int kNTiles>
    __device__ __forceinline__ void fetch_words(const int (&fixed)[2], int first) {
        WordsAt w;
        if (ahead_slot >= 0 && words_at<kKeyRows, kNTiles>(fixed, first, &w)) {
#pragma unroll
            for (int r = 0; r < 2; ++r) ahead_rows[r] = row_word<kKeyRows, kNTiles>(ahead_slot, w, r);
        }
    }

    // The function over a thread's two rows of a fragment (fragment/scores.cuh), as bits t of visible[r]
    // and poisoned[r] for t < 2 kNTiles: with kKeyRows (a column fragment: the backward) keys fixed[r]
    // and queries first + 8 (t / 2) + t % 2, else (a row fragment) queries fixed[r] and those keys. A
    // loop unrolled 4 times, not fully, so the function's temporaries live only inside it, not beside a
    // fragment's scores (unrolled fully, the Hopper forward's document mask spilled 1,348 bytes; 8 times,
    // the Hopper backward with an additive bias spilled more); 4 positions' loads issue together
    // (user_mask_load), where one position at a time waited out a load's latency 32 times a forward
    // tile. Both rows in one iteration, so what the function reads of the position they share (a
    // document mask's doc[b, q] in the backward) is read once for the two.
    template <bool kKeyRows, int kNTiles>
    __device__ __forceinline__ void bits(const int (&fixed)[2], int first, unsigned long long (&visible)[2],
                                         unsigned long long (&poisoned)[2]) const {
        constexpr int kRowBits = 2 * kNTiles;
        static_assert(kRowBits <= 32, "a row's bits in one 32-bit word");
        // (a block where the function reads out of range keeps no bits: its slot is -1)
        if ((!kKeyRows || kColumnWords) && ahead_slot != kNotFetched) {
            if (ahead_slot >= 0) {
                visible[0] = ahead_rows[0];
                visible[1] = ahead_rows[1];
                poisoned[0] = poisoned[1] = 0;
                return;
            }
        } else if constexpr (!kKeyRows || kColumnWords) {
            if (a->sparse.elem_slot != nullptr && from_words<kKeyRows, kNTiles>(fixed, first, visible)) {
                poisoned[0] = poisoned[1] = 0;
                return;
            }
        }
        if constexpr (2 * kRowBits <= 32) {
            // Both rows in one word (up to 8 n-tiles: the Hopper backward, whose registers are spoken for).
            unsigned seen = 0, bad = 0;
#pragma unroll 4
            for (int t = 0; t < kRowBits; ++t) {
                bool p0, p1;
                const bool v0 = at<kKeyRows>(fixed[0], first, t, &p0);
                const bool v1 = at<kKeyRows>(fixed[1], first, t, &p1);
                seen |= (static_cast<unsigned>(v0) << t) | (static_cast<unsigned>(v1) << (t + kRowBits));
                bad |= (static_cast<unsigned>(p0) << t) | (static_cast<unsigned>(p1) << (t + kRowBits));
            }
            constexpr unsigned kRow = (1u << kRowBits) - 1;
            visible[0] = seen & kRow;
            visible[1] = seen >> kRowBits;
            poisoned[0] = bad & kRow;
            poisoned[1] = bad >> kRowBits;
        } else {
            // A word a row, its bits entering at the bottom, last position first: a shift by one and an or
            // a bit, where shifts by t of one 64-bit word for the two rows and their merges took about
            // five. Which positions are poisoned (the function read past a buffer: a bug in it, rare) is
            // asked only where some was, in a loop of its own.
            unsigned seen[2] = {0, 0};
            bool bad = false;
#pragma unroll 4
            for (int t = kRowBits - 1; t >= 0; --t) {
                bool p0, p1;
                const bool v0 = at<kKeyRows>(fixed[0], first, t, &p0);
                const bool v1 = at<kKeyRows>(fixed[1], first, t, &p1);
                seen[0] = (seen[0] << 1) | static_cast<unsigned>(v0);
                seen[1] = (seen[1] << 1) | static_cast<unsigned>(v1);
                bad |= p0 | p1;
            }
            visible[0] = seen[0];
            visible[1] = seen[1];
            poisoned[0] = poisoned[1] = 0;
            if (bad) {
#pragma unroll 1
                for (int t = 0; t < kRowBits; ++t) {
                    bool p0, p1;
                    at<kKeyRows>(fixed[0], first, t, &p0);
                    at<kKeyRows>(fixed[1], first, t, &p1);
                    poisoned[0] |= static_cast<unsigned long long>(p0) << t;
                    poisoned[1] |= static_cast<unsigned long long>(p1) << t;
                }
            }
        }
    }

  private:
    // Where a fragment's bits lie among the words from_mask_mod kept for the partial block its two rows
    // lie in (common/mask_mod_blocks.cu's mask_mod_bits, whose words hold a fragment's positions in its
    // order, rows of queries for row fragments, rows of keys for column ones): the layout cell whose slot
    // names the block's words, the word of the thread's positions in the block's first row, each row's
    // offset from it, and the shift to the positions. False where they are not within one kept word
    // (rows in two blocks or past the layout, a tile that crosses a word): the function then runs.
    struct WordsAt {
        long long cell;
        int word, rows[2], shift;
    };
    template <bool kKeyRows, int kNTiles>
    __device__ __forceinline__ bool words_at(const int (&fixed)[2], int first, WordsAt* w) const {
        const BlockSparseArg& sp = a->sparse;
        const int c = (first & 7) >> 1;  // the thread's quad column: first is 2 c past a multiple of 8
        const int base = first - 2 * c;
        if (fixed[0] < 0 || base < 0) return false;
        const int fix_block = kKeyRows ? sp.block_k : sp.block_q;
        const int vary_block = kKeyRows ? sp.block_q : sp.block_k;
        const int fb = fixed[0] / fix_block, vb = base / vary_block;
        const int along = base - vb * vary_block;  // the thread's first position in its block
        const int row = kKeyRows ? vb : fb, col = kKeyRows ? fb : vb;
        if (fixed[1] / fix_block != fb || row >= sp.layout_rows || col >= sp.layout_cols ||
            along % 128 + 8 * kNTiles > 128) {
            return false;
        }
        // The layout slice of the mask's (b, h): user_mask_batch and user_mask_head gave 0 on broadcast axes.
        const long long slice = b * sp.slice_batch_stride + h * sp.slice_head_stride;
        w->cell = (slice * sp.layout_rows + row) * sp.layout_cols + col;
        w->word = (kKeyRows ? sp.block_q * sp.block_k / 32 : 0) + c * (vary_block / 128) + along / 128;
        const int per_row = vary_block / 32;  // words of a row: 4 quad columns of vary_block / 128
#pragma unroll
        for (int r = 0; r < 2; ++r) w->rows[r] = (fixed[r] - fb * fix_block) * per_row;
        w->shift = along % 128 / 4;  // 2 bits for every 8 positions before the thread's first
        return true;
    }

    // Row r's bits (bit 2 nt + c) from the words of `slot`.
    template <bool kKeyRows, int kNTiles>
    __device__ __forceinline__ unsigned row_word(int slot, const WordsAt& w, int r) const {
        const BlockSparseArg& sp = a->sparse;
        const unsigned* words = sp.elem_bits + static_cast<long long>(slot) * (sp.block_q * sp.block_k / 16) + w.word;
        constexpr unsigned long long kRow = (1ull << (2 * kNTiles)) - 1;
        return static_cast<unsigned>((static_cast<unsigned long long>(words[w.rows[r]]) >> w.shift) & kRow);
    }

    // The bits of a fragment's two rows from those words: one load a row and a shift, where the function
    // costs about 12 instructions a position. False where words_at is, or the block kept no bits.
    template <bool kKeyRows, int kNTiles>
    __device__ __forceinline__ bool from_words(const int (&fixed)[2], int first, unsigned long long (&visible)[2]) const {
        WordsAt w;
        if (!words_at<kKeyRows, kNTiles>(fixed, first, &w)) return false;
        const int slot = a->sparse.elem_slot[w.cell];
        if (slot < 0) return false;
#pragma unroll
        for (int r = 0; r < 2; ++r) visible[r] = row_word<kKeyRows, kNTiles>(slot, w, r);
        return true;
    }

    // The function at position t of row `fixed` (bits' numbering).
    template <bool kKeyRows>
    __device__ __forceinline__ bool at(int fixed, int first, int t, bool* poisoned) const {
        const int x = first + 8 * (t / 2) + t % 2;
        return kKeyRows ? MaskFn::visible(b, h, x, fixed, a->mask_buffers, poisoned)
                        : MaskFn::visible(b, h, fixed, x, a->mask_buffers, poisoned);
    }
};
template <bool kColumnWords>
struct UserMaskAt<NoUserMask, kColumnWords> {
    static constexpr bool kEnabled = false;
    static constexpr bool kWords = false;
    UserMaskAt() = default;
    __device__ __forceinline__ UserMaskAt(const AttnArgs&, int, int) {}

    template <bool kKeyRows, int kNTiles>
    __device__ __forceinline__ void bits(const int (&)[2], int, unsigned long long (&visible)[2],
                                         unsigned long long (&poisoned)[2]) const {
        visible[0] = visible[1] = ~0ull;
        poisoned[0] = poisoned[1] = 0;
    }
};

}  // namespace cupyflash
