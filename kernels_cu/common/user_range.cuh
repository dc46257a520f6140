// The ranges a score function's values take over a tile (cupyflash/_trace.py's uniform: the generated
// UserScore::uniform), so a kernel can tell the tiles where every part of the function that reads q_idx
// or kv_idx holds one value: there the function of the whole tile is its function at one pair (a T5 bias
// past its clip adds one table entry to every score of the tile), evaluated once (common/user_calls.cuh's
// frozen scores) where it would be evaluated per pair.
//
// The ranges must hold every value a pair of the tile computes, never less: a range that is one value
// when the pairs' are not would give some pairs another pair's score. So
// * int ranges are kept in 64 bits, and one that leaves the 32-bit range holds every int (the values
//   wrap);
// * a float range is one value (any, NaN and infinities included) or finite bounds; an operation whose
//   bounds are not finite gives the unknown range (NaN bounds, which no test below takes as one value);
// * + - * / and floor are correctly rounded, hence monotone, so the roundings of the bounds hold the
//   roundings of the values between them; the math library's functions are a few ulps from correctly
//   rounded and their fast forms a little more (common/user_mod.cuh), so their bounds are widened by
//   2^-10 relative and 2^-20 absolute, far past those errors.
// Host and device code alike (tests/test_mods.py checks the generated uniform against every pair).
#pragma once
#include "common/user_mod.cuh"

namespace cupyflash {

// Ints and bools: [lo, hi].
struct UserIntRange {
    long long lo, hi;
};

// Floats: [lo, hi], or NaN bounds (unknown).
template <typename F>
struct UserFloatRange {
    F lo, hi;
};

CUPYFLASH_HD bool user_range_one(const UserIntRange& a) { return a.lo == a.hi; }
// One float: equal bounds, zeros of one sign (a pair dividing by it takes that sign); false for NaN.
template <typename F>
CUPYFLASH_HD bool user_range_one(const UserFloatRange<F>& a) {
    return a.lo == a.hi && (a.lo != F(0) || user_div(F(1), a.lo) == user_div(F(1), a.hi));
}

CUPYFLASH_HD UserIntRange user_range_all_ints() { return {-2147483647ll - 1, 2147483647ll}; }
CUPYFLASH_HD UserIntRange user_range(long long lo, long long hi) {
    const UserIntRange all = user_range_all_ints();
    return (lo < all.lo || hi > all.hi) ? all : UserIntRange{lo, hi};
}
CUPYFLASH_HD UserIntRange user_range_point(int v) { return {v, v}; }
CUPYFLASH_HD UserIntRange user_range_bool() { return {0, 1}; }

template <typename F>
CUPYFLASH_HD UserFloatRange<F> user_range_unknown(F) {
    return {user_nan(F(0)), user_nan(F(0))};
}
template <typename F>
CUPYFLASH_HD bool user_finite(F x) {
    return x == x && x != user_inf(F(0)) && x != -user_inf(F(0));
}
// [lo, hi] if both bounds are finite, else unknown; bounds 0 and 0 of values that are not one value may
// be zeros of both signs.
template <typename F>
CUPYFLASH_HD UserFloatRange<F> user_range(F lo, F hi) {
    if (!user_finite(lo) || !user_finite(hi)) return user_range_unknown(F(0));
    return (lo == F(0) && hi == F(0)) ? UserFloatRange<F>{-F(0), F(0)} : UserFloatRange<F>{lo, hi};
}
template <typename F>
CUPYFLASH_HD UserFloatRange<F> user_range_point(F v) {
    return {v, v};
}
template <typename F>
CUPYFLASH_HD bool user_range_finite(const UserFloatRange<F>& a) {
    return user_finite(a.lo) && user_finite(a.hi);
}

template <typename T>
CUPYFLASH_HD T user_min4(T a, T b, T c, T d) {
    const T x = a < b ? a : b, y = c < d ? c : d;
    return x < y ? x : y;
}
template <typename T>
CUPYFLASH_HD T user_max4(T a, T b, T c, T d) {
    const T x = a > b ? a : b, y = c > d ? c : d;
    return x > y ? x : y;
}

// ------------------------------------------------------------------------------------------ ints
CUPYFLASH_HD UserIntRange user_range_add(const UserIntRange& a, const UserIntRange& b) {
    return user_range(a.lo + b.lo, a.hi + b.hi);
}
CUPYFLASH_HD UserIntRange user_range_sub(const UserIntRange& a, const UserIntRange& b) {
    return user_range(a.lo - b.hi, a.hi - b.lo);
}
CUPYFLASH_HD UserIntRange user_range_mul(const UserIntRange& a, const UserIntRange& b) {
    // Bounds within 2^31 in magnitude: their products fit in 64 bits.
    return user_range(user_min4(a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi),
                      user_max4(a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi));
}
CUPYFLASH_HD UserIntRange user_range_neg(const UserIntRange& a) { return user_range(-a.hi, -a.lo); }
CUPYFLASH_HD UserIntRange user_range_abs(const UserIntRange& a) {
    if (a.lo >= 0) return a;
    if (a.hi <= 0) return user_range(-a.hi, -a.lo);
    return user_range(0, -a.lo > a.hi ? -a.lo : a.hi);
}
CUPYFLASH_HD UserIntRange user_range_minimum(const UserIntRange& a, const UserIntRange& b) {
    return {a.lo < b.lo ? a.lo : b.lo, a.hi < b.hi ? a.hi : b.hi};
}
CUPYFLASH_HD UserIntRange user_range_maximum(const UserIntRange& a, const UserIntRange& b) {
    return {a.lo > b.lo ? a.lo : b.lo, a.hi > b.hi ? a.hi : b.hi};
}
// Python's a // d in 64 bits.
CUPYFLASH_HD long long user_floordiv64(long long a, long long d) {
    const long long q = a / d;
    return (a % d != 0 && ((a < 0) != (d < 0))) ? q - 1 : q;
}
// // and % by one divisor d (a range of divisors: any int): monotone in a for d > 0, the reverse for d < 0;
// d of 0 gives 0, as user_floordiv does.
CUPYFLASH_HD UserIntRange user_range_floordiv(const UserIntRange& a, const UserIntRange& d) {
    if (d.lo != d.hi) return user_range_all_ints();
    if (d.lo == 0) return user_range_point(0);
    const long long x = user_floordiv64(a.lo, d.lo), y = user_floordiv64(a.hi, d.lo);
    return d.lo > 0 ? user_range(x, y) : user_range(y, x);
}
// The remainder a - d (a // d) rises with a while the quotient stays: between those values when it does
// (one quotient over the range), else anywhere in [0, d) (or (d, 0]).
CUPYFLASH_HD UserIntRange user_range_mod(const UserIntRange& a, const UserIntRange& d) {
    if (d.lo != d.hi) return user_range_all_ints();
    if (d.lo == 0 || d.lo == -1) return user_range_point(0);
    const long long q = user_floordiv64(a.lo, d.lo);
    if (q == user_floordiv64(a.hi, d.lo)) return user_range(a.lo - q * d.lo, a.hi - q * d.lo);
    return d.lo > 0 ? user_range(0, d.lo - 1) : user_range(d.lo + 1, 0);
}
// & | ^ on ints: one value from one value each, else any int; ~ is -1 - x, falling.
CUPYFLASH_HD UserIntRange user_range_bits(const UserIntRange& a, const UserIntRange& b, int value) {
    return (user_range_one(a) && user_range_one(b)) ? user_range_point(value) : user_range_all_ints();
}
CUPYFLASH_HD UserIntRange user_range_invert_int(const UserIntRange& a) { return user_range(-1 - a.hi, -1 - a.lo); }

// ------------------------------------------------------------------------------------------ bools
CUPYFLASH_HD UserIntRange user_range_and(const UserIntRange& a, const UserIntRange& b) {
    return {a.lo & b.lo, a.hi & b.hi};
}
CUPYFLASH_HD UserIntRange user_range_or(const UserIntRange& a, const UserIntRange& b) {
    return {a.lo | b.lo, a.hi | b.hi};
}
CUPYFLASH_HD UserIntRange user_range_xor(const UserIntRange& a, const UserIntRange& b) {
    return (user_range_one(a) && user_range_one(b)) ? user_range_point(static_cast<int>(a.lo ^ b.lo)) : user_range_bool();
}
CUPYFLASH_HD UserIntRange user_range_not(const UserIntRange& a) { return {1 - a.hi, 1 - a.lo}; }

// Comparisons of two ranges (ints or floats): true or false where every pair of values agrees; a NaN
// bound makes every test below false, so the result may be either.
template <typename R>
CUPYFLASH_HD UserIntRange user_range_lt(const R& a, const R& b) {
    if (a.hi < b.lo) return user_range_point(1);
    if (a.lo >= b.hi) return user_range_point(0);
    return user_range_bool();
}
template <typename R>
CUPYFLASH_HD UserIntRange user_range_le(const R& a, const R& b) {
    if (a.hi <= b.lo) return user_range_point(1);
    if (a.lo > b.hi) return user_range_point(0);
    return user_range_bool();
}
template <typename R>
CUPYFLASH_HD UserIntRange user_range_gt(const R& a, const R& b) { return user_range_lt(b, a); }
template <typename R>
CUPYFLASH_HD UserIntRange user_range_ge(const R& a, const R& b) { return user_range_le(b, a); }
template <typename R>
CUPYFLASH_HD UserIntRange user_range_eq(const R& a, const R& b) {
    if (user_range_one(a) && user_range_one(b) && a.lo == b.lo) return user_range_point(1);
    if (a.hi < b.lo || b.hi < a.lo) return user_range_point(0);
    return user_range_bool();
}
template <typename R>
CUPYFLASH_HD UserIntRange user_range_ne(const R& a, const R& b) { return user_range_not(user_range_eq(a, b)); }

// where(c, x, y): the branch c takes where c is one value, else both.
CUPYFLASH_HD UserIntRange user_range_where(const UserIntRange& c, const UserIntRange& x, const UserIntRange& y) {
    if (user_range_one(c)) return c.lo ? x : y;
    return {x.lo < y.lo ? x.lo : y.lo, x.hi > y.hi ? x.hi : y.hi};
}
template <typename F>
CUPYFLASH_HD UserFloatRange<F> user_range_where(const UserIntRange& c, const UserFloatRange<F>& x,
                                                const UserFloatRange<F>& y) {
    if (user_range_one(c)) return c.lo ? x : y;
    if (!user_range_finite(x) || !user_range_finite(y)) return user_range_unknown(F(0));
    return user_range(x.lo < y.lo ? x.lo : y.lo, x.hi > y.hi ? x.hi : y.hi);
}

// ------------------------------------------------------------------------------------------ conversions
template <typename F>
CUPYFLASH_HD UserFloatRange<F> user_range_to_float(const UserIntRange& a, F) {
    return {F(static_cast<int>(a.lo)), F(static_cast<int>(a.hi))};
}
// Truncation with saturation is monotone; NaN gives 0, so an unknown range may be any int.
template <typename F>
CUPYFLASH_HD UserIntRange user_range_to_int(const UserFloatRange<F>& a) {
    if (user_range_one(a)) return user_range_point(user_to_int(a.lo));
    if (!user_range_finite(a)) return user_range_all_ints();
    return {user_to_int(a.lo), user_to_int(a.hi)};
}
CUPYFLASH_HD UserIntRange user_range_to_bool(const UserIntRange& a) {
    if (a.lo > 0 || a.hi < 0) return user_range_point(1);
    if (a.lo == 0 && a.hi == 0) return user_range_point(0);
    return user_range_bool();
}
template <typename F>
CUPYFLASH_HD UserIntRange user_range_to_bool(const UserFloatRange<F>& a) {
    if (user_range_one(a)) return user_range_point(a.lo != F(0));  // NaN != 0
    if (user_range_finite(a) && (a.lo > F(0) || a.hi < F(0))) return user_range_point(1);
    return user_range_bool();
}

// ------------------------------------------------------------------------------------------ floats
// One value from one value each (any: NaN, infinite), else the corners' range if every bound is finite.
template <typename F>
CUPYFLASH_HD UserFloatRange<F> user_range_add(const UserFloatRange<F>& a, const UserFloatRange<F>& b) {
    if (user_range_one(a) && user_range_one(b)) return user_range_point(user_add(a.lo, b.lo));
    if (!user_range_finite(a) || !user_range_finite(b)) return user_range_unknown(F(0));
    return user_range(user_add(a.lo, b.lo), user_add(a.hi, b.hi));
}
template <typename F>
CUPYFLASH_HD UserFloatRange<F> user_range_sub(const UserFloatRange<F>& a, const UserFloatRange<F>& b) {
    if (user_range_one(a) && user_range_one(b)) return user_range_point(user_sub(a.lo, b.lo));
    if (!user_range_finite(a) || !user_range_finite(b)) return user_range_unknown(F(0));
    return user_range(user_sub(a.lo, b.hi), user_sub(a.hi, b.lo));
}
template <typename F>
CUPYFLASH_HD UserFloatRange<F> user_range_mul(const UserFloatRange<F>& a, const UserFloatRange<F>& b) {
    if (user_range_one(a) && user_range_one(b)) return user_range_point(user_mul(a.lo, b.lo));
    if (!user_range_finite(a) || !user_range_finite(b)) return user_range_unknown(F(0));
    const F w = user_mul(a.lo, b.lo), x = user_mul(a.lo, b.hi), y = user_mul(a.hi, b.lo), z = user_mul(a.hi, b.hi);
    return user_range(user_min4(w, x, y, z), user_max4(w, x, y, z));
}
// A divisor range that holds 0 (or touches it) gives infinities or NaN: unknown.
template <typename F>
CUPYFLASH_HD UserFloatRange<F> user_range_div(const UserFloatRange<F>& a, const UserFloatRange<F>& b) {
    if (user_range_one(a) && user_range_one(b)) return user_range_point(user_div(a.lo, b.lo));
    if (!user_range_finite(a) || !user_range_finite(b) || !(b.lo > F(0) || b.hi < F(0))) return user_range_unknown(F(0));
    const F w = user_div(a.lo, b.lo), x = user_div(a.lo, b.hi), y = user_div(a.hi, b.lo), z = user_div(a.hi, b.hi);
    return user_range(user_min4(w, x, y, z), user_max4(w, x, y, z));
}
template <typename F>
CUPYFLASH_HD UserFloatRange<F> user_range_neg(const UserFloatRange<F>& a) { return {-a.hi, -a.lo}; }
template <typename F>
CUPYFLASH_HD UserFloatRange<F> user_range_abs(const UserFloatRange<F>& a) {
    if (user_range_one(a)) return user_range_point(user_abs(a.lo));
    if (!user_range_finite(a)) return user_range_unknown(F(0));
    if (a.lo >= F(0)) return a;
    if (a.hi <= F(0)) return {-a.hi, -a.lo};
    return {F(0), -a.lo > a.hi ? -a.lo : a.hi};
}
// One value from one value each; else NaN bounds stay NaN (user_minimum propagates them), and a bound
// that ties zeros may be either.
template <typename F>
CUPYFLASH_HD UserFloatRange<F> user_range_minimum(const UserFloatRange<F>& a, const UserFloatRange<F>& b) {
    if (user_range_one(a) && user_range_one(b)) return user_range_point(user_minimum(a.lo, b.lo));
    if (!user_range_finite(a) || !user_range_finite(b)) return user_range_unknown(F(0));
    return user_range(user_minimum(a.lo, b.lo), user_minimum(a.hi, b.hi));
}
template <typename F>
CUPYFLASH_HD UserFloatRange<F> user_range_maximum(const UserFloatRange<F>& a, const UserFloatRange<F>& b) {
    if (user_range_one(a) && user_range_one(b)) return user_range_point(user_maximum(a.lo, b.lo));
    if (!user_range_finite(a) || !user_range_finite(b)) return user_range_unknown(F(0));
    return user_range(user_maximum(a.lo, b.lo), user_maximum(a.hi, b.hi));
}
template <typename F>
CUPYFLASH_HD UserFloatRange<F> user_range_floor(const UserFloatRange<F>& a) {
    return user_range_one(a) ? user_range_point(user_floor(a.lo)) : user_range(user_floor(a.lo), user_floor(a.hi));
}
template <typename F>
CUPYFLASH_HD UserFloatRange<F> user_range_ceil(const UserFloatRange<F>& a) {
    return user_range_one(a) ? user_range_point(user_ceil(a.lo)) : user_range(user_ceil(a.lo), user_ceil(a.hi));
}
// a // d and a % d (common/user_mod.cuh's float forms) for one finite divisor, as for ints.
template <typename F>
CUPYFLASH_HD UserFloatRange<F> user_range_floordiv(const UserFloatRange<F>& a, const UserFloatRange<F>& d) {
    return user_range_floor(user_range_div(a, d));
}
template <typename F>
CUPYFLASH_HD UserFloatRange<F> user_range_mod(const UserFloatRange<F>& a, const UserFloatRange<F>& d) {
    if (user_range_one(a) && user_range_one(d)) return user_range_point(user_mod(a.lo, d.lo));
    const UserFloatRange<F> q = user_range_floordiv(a, d);
    if (!user_range_one(q) || !user_range_finite(a) || !user_range_one(d)) return user_range_unknown(F(0));
    const F step = user_mul(d.lo, q.lo);
    return user_range(user_sub(a.lo, step), user_sub(a.hi, step));
}
// A function that rises (exp, exp2, log, log2, sqrt, tanh, sigmoid) over range a, given its values at the
// bounds: one value from one, else those values widened (NaN or infinite ones: unknown).
template <typename F>
CUPYFLASH_HD UserFloatRange<F> user_range_rising(const UserFloatRange<F>& a, F at_lo, F at_hi) {
    if (user_range_one(a)) return user_range_point(at_lo);
    if (!user_range_finite(a) || !user_finite(at_lo) || !user_finite(at_hi)) return user_range_unknown(F(0));
    const F rel = F(1.0 / 1024), abs = F(1.0 / 1048576);
    return user_range(at_lo - (at_lo < F(0) ? -at_lo : at_lo) * rel - abs,
                      at_hi + (at_hi < F(0) ? -at_hi : at_hi) * rel + abs);
}
// Functions that are neither (x ** c): one value from one, else unknown.
template <typename F>
CUPYFLASH_HD UserFloatRange<F> user_range_other(const UserFloatRange<F>& a, F at_lo) {
    return user_range_one(a) ? user_range_point(at_lo) : user_range_unknown(F(0));
}

}  // namespace cupyflash
