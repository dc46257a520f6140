# Byte-level model of split_staged_rows (kernels_cu/sm90/planes_split.cuh) against the TMA 128B-swizzled
# staging box layout and split_rows_into_planes' plane layout.
def staged_addr(r, c, rows=32):  # float32 (r, c) of a staged slot: 32-column atoms of rows x 128 B
    atom, cc = divmod(c, 32)
    return atom * rows * 128 + r * 128 + (((cc * 4) // 16) ^ (r % 8)) * 16 + (cc * 4) % 16

def plane_addr(row, col, tile_rows):  # bf16 (row, col) as split_rows_into_planes writes it
    return (col // 64) * tile_rows * 128 + row * 128 + (((col % 64) // 8) ^ (row % 8)) * 16 + (col % 8) * 2

for d in (64, 128):
    kThreads, kRows, tile_rows = 64, 32, 64
    kQuads = d // 4; kStep = kThreads // kQuads
    for tile_row0 in (0, 32):
        seen = {}
        for thread in range(kThreads):
            c4, r0 = thread % kQuads, thread // kQuads
            src = (c4 // 8) * kRows * 128 + r0 * 128; src_chunk = (c4 % 8) ^ r0
            dst = (c4 // 16) * tile_rows * 128 + (tile_row0 + r0) * 128 + (c4 % 2) * 8
            dst_chunk = ((c4 % 16) // 2) ^ r0
            for u in range(kRows // kStep):
                sw = kStep * u % 8
                s = src + u * kStep * 128 + (src_chunk ^ sw) * 16
                dd = dst + u * kStep * 128 + (dst_chunk ^ sw) * 16
                r = r0 + kStep * u
                for e in range(4):
                    c = 4 * c4 + e
                    assert s + 4 * e == staged_addr(r, c), (d, thread, u, e)
                    assert dd + 2 * e == plane_addr(tile_row0 + r, c, tile_rows), (d, thread, u, e)
                    assert (r, c) not in seen; seen[(r, c)] = 1
        assert len(seen) == kRows * d
print("split_staged_rows: every (row, column) read from its swizzled staged address and written to its plane address, once")
