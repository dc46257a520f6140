// Which work tiles the CTAs of a persistent Hopper kernel take, and in which order.
//
// The grid has at most one CTA per SM; CTA c (cluster c) starts with work tile c and asks for its next one
// while the current one runs. Work tiles are of kBlockM query rows of one (batch entry, head); their index w
// in [0, work_count) decodes, by the schedule, into the tile's batch entry, head and first row.
#pragma once
#include "common/math.cuh"
#include "common/params.cuh"

namespace cupyflash {

// The order in which the persistent CTAs take work tiles (cupyflash/_families/sm90.py chooses it).
struct Sm90Schedule {
    // 0: the tiles of one (batch entry, head) together, CTA c taking tiles c, c + gridDim.x, ... (equal
    // tiles: the CTAs running at once share one head's K and V in L2). 1: handed out as CTAs become free,
    // in sections of `section` consecutive (batch entry, head) pairs whose K and V fit in L2 together;
    // inside a section the tiles with the most keys first (causal and other masks, packed batches). One
    // section over every head would send the CTAs running at once to more K and V than L2 holds.
    int longest_first;
    int section;     // (batch entry, head) pairs per section, >= 1 (longest_first)
    int* next_work;  // zero at the launch, and left zero: calls of next() so far (longest_first)
    // 1: the query tiles end at each sequence's last row, so a partial tile is the first, which under
    // a causal mask sees the fewest keys (the last sees the most and then has every row real), and its
    // first rows are negative (never stored). 0: they start at row 0 (block masks: their query blocks
    // start there).
    int align_end;
};

// kCtas > 1 (sm90_fwd_pairs): the work tiles are of clusters of kCtas CTAs, each cluster taking the same
// rows of kCtas consecutive query heads (CTA r of the cluster head kCtas * h' + r, the host making sure
// they share a kv head); only CTA 0 of a cluster calls next() (Sm90FwdKernel::share_work).
template <int kBlockM, int kCtas_ = 1>
struct Sm90QueryTileScheduler {
    static constexpr int kCtas = kCtas_;
    int num_tiles;   // query tiles of the longest sequence
    int heads;       // batch * heads / kCtas
    int work_count;  // below 2^31: the host limits the grid of every kernel

    __device__ __forceinline__ explicit Sm90QueryTileScheduler(const AttnArgs& a)
        : num_tiles(ceil_div(a.seqlen_q, kBlockM)), heads(a.batch * a.heads / kCtas), work_count(num_tiles * heads) {}

    __device__ __forceinline__ static int first() { return static_cast<int>(blockIdx.x) / kCtas; }

    // The CTA's work tile after w (the producer asks a work tile ahead, so the atomic's latency passes
    // under the running one). Every call counts once in next_work: one per tile handed out after the
    // CTAs' first ones, and one per CTA that finds none left, work_count in all. The call that counts
    // the last sets the counter back to zero for the next launch (no other call of this launch is left
    // to read it), so a plan needs no memset before each launch.
    __device__ __forceinline__ int next(const Sm90Schedule& schedule, int w) const {
        const int clusters = static_cast<int>(gridDim.x) / kCtas;
        if (!schedule.longest_first) return clusters + w;
        const int handed = atomicAdd(schedule.next_work, 1);
        if (handed == work_count - 1) *schedule.next_work = 0;
        return clusters + handed;
    }

    __device__ __forceinline__ bool finished(int w) const { return w >= work_count; }

    // The first row of a decoded work tile (decode's m0) in a sequence of seqlen_q rows, by the
    // schedule's alignment; the tile has real rows iff it is in (-kBlockM, seqlen_q).
    __device__ __forceinline__ int first_row(const Sm90Schedule& schedule, int seqlen_q, int m0) const {
        return schedule.align_end ? seqlen_q - (num_tiles * kBlockM - m0) : m0;
    }

    // Batch entry, head and first row of work tile w < work_count for CTA `cta` of its cluster. Query tiles
    // count from the last: under a causal mask it sees the most keys.
    __device__ __forceinline__ void decode(const Sm90Schedule& schedule, const AttnArgs& a, int w, int cta, int* b,
                                           int* h, int* m0) const {
        int rank, bh;
        if (schedule.longest_first) {
            const int first_bh = w / (schedule.section * num_tiles) * schedule.section;
            const int local = w - first_bh * num_tiles;            // the tile's place in its section
            const int pairs = min(schedule.section, heads - first_bh);  // the last section may be short
            rank = local / pairs;
            bh = first_bh + local % pairs;
        } else {
            rank = w % num_tiles;
            bh = w / num_tiles;
        }
        const int groups = a.heads / kCtas;  // clusters of query heads a batch entry
        *b = bh / groups;
        *h = bh % groups * kCtas + cta;
        *m0 = (num_tiles - 1 - rank) * kBlockM;
    }
};

}  // namespace cupyflash
