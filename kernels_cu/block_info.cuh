// Which rows, batch and head a CTA works on: the decode of the flattened grid index.
//
// The attention kernels (all but general_bwd_delta) launch grid.x = row blocks * batch * heads with the
// row blocks fastest (one axis of up to 2^31 - 1 CTAs, so no batch * heads limit of 65535). Rows are
// queries or keys, heads are query or kv heads, depending on the kernel.
#pragma once

namespace cupyflash {

struct BlockInfo {
    int row0;      // first row of this CTA's block
    long long bh;  // batch * heads + head: the (batch, head) index of (batch, heads, seqlen) arrays
    long long b;   // batch
    long long h;   // head

    // reverse: hand out the last row blocks first. Forward and dQ kernels (rows are queries): under a
    // causal mask the last query blocks see the most keys, so the longest CTAs start early and the
    // tail of the launch is short. tc_bwd (rows are keys): its ordered sum needs the last key blocks
    // launched first (see tc_bwd.cu).
    __device__ __forceinline__ BlockInfo(int seqlen, int block, int heads, bool reverse) {
        const int num_blocks = (seqlen + block - 1) / block;
        const int index = static_cast<int>(blockIdx.x % num_blocks);
        row0 = (reverse ? num_blocks - 1 - index : index) * block;
        bh = blockIdx.x / num_blocks;
        h = bh % heads;
        b = bh / heads;
    }

    // The kv head that query head h reads under GQA/MQA.
    __device__ __forceinline__ long long kv_head(int heads, int heads_k) const { return h / (heads / heads_k); }
};

}  // namespace cupyflash
