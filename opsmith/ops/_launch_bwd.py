"""The norm backwards' launch plans: the persistent and "split" backwards of the register rows
(``norm_bwd_plan``), the column sums of their partial sums (``col_sum_plan``), the weight-gradient kernels after the
split and long-row backwards (``weight_grad_plan``), the backwards of few rows in one launch (``norm_bwd_small_plan``),
the float rows of 4 chunks a thread (``norm_bwd_c4_plan``) and the persistent rows at two blocks an SM
(``norm_bwd_sm_plan``). Their numbers live in :mod:`opsmith.ops._launch` with
the others the C++ plans (native/osm_ops_plan.h) share."""
from __future__ import annotations

import functools

from opsmith.ops._launch import (_STATIC_SMEM, BWD_C4_CHUNKS, BWD_C4_LN_MIN_ROW_BYTES, BWD_SM_THREADS, NORM_BWD_BLOCK,
                                 NORM_SPLIT_BYTES, ROW_BWD_BLOCKS, ROW_CHUNKS, ROW_THREADS, SMALL_BWD_ROWS,
                                 SMALL_MIN_LANES, WEIGHT_CLUSTER, WEIGHT_CLUSTER_BYTES, WEIGHT_LANE_ROWS, DeviceProps,
                                 Plan, _cdiv, _pow2_at_least, _warps_of, row_plan)

__all__ = ["col_sum_plan", "norm_bwd_c4_plan", "norm_bwd_plan", "norm_bwd_small_plan", "norm_bwd_sm_plan",
           "weight_grad_plan"]


@functools.lru_cache(maxsize=4096)
def norm_bwd_plan(rows: int, cols: int, itemsize: int, props: DeviceProps, arrays: int = 2) -> Plan:
    """The norm backwards (``arrays``: the weight gradients a persistent block sums, 2 for
    layer_norm's weight and bias, 1 for rms_norm's weight). Rows that fit the register strategy
    run ``"persistent"``: blocks of about 256 threads (``tpr`` a row, as ``row_plan``, several rows
    a block), as many blocks as the SMs hold at once (``ROW_THREADS * ROW_BWD_BLOCKS`` threads an
    SM: the kernels take up to 128 registers a thread for two rows in flight) striding over the
    rows, each block adding its rows' weight-gradient terms and writing one row of partial sums
    (``grid`` of them, at least two rows per row lane), which ``norm_col_sum`` adds up. A grid of
    twice that ran as two waves and 20-35 % slower on an H200 (bench/diag_norm_bwd.py). Where
    blocks hold several rows and a row a row lane takes no more blocks than the SMs, each lane
    takes one row (bf16 512x1024 on an H200: layer_norm's backward kernels 7.95 -> 6.84 us).

    ``"split"`` where a row a block fits the SMs (all rows at once, where the persistent kernel took
    two trips), or a block's rows would hold fewer than ``NORM_SPLIT_BYTES * arrays`` bytes a
    column (24 for layer_norm, 12 for rms_norm): the partial sums (4 bytes a column and
    array a block, written and read again) then cost more than reading grad and x twice.
    norm_split.cu's kernels write grad_x alone, a row a row lane and every row at once (``grid``
    covers the rows), at up to 1024 threads an SM; then ``norm_bwd_weight`` (``weight_grad_plan``).
    On an H200, bf16 backward kernels, layer_norm 1024x4096: 28.9 -> 13.3 us (eager 14.4),
    2048x4096: 37.8 -> 26.5 (eager 30.8); at 31 bytes (4096x4096) the persistent kernels stay
    ahead: layer_norm 51.5 against 53.4, rms_norm 39.4 against 51.2; rms_norm at 15.5 bytes either
    way by 5-8 % (2048x2048: 13.2 persistent against 13.9; 2048x4096: 26.5 against 25.0), where it
    keeps the persistent kernel (bench/results/ops-norm-split-h200-2026-11-26/). Longer rows:
    ``row_plan``'s long plan (the weight gradient then comes from ``norm_bwd_weight``).

    Rows of 2- and 4-byte types that are whole warps of ``ROW_CHUNKS`` chunks fewer than ``tpr`` (bf16 multiples of
    512 columns from 1,536 to 7,680 but 2,048 and 4,096; float half those) take exactly those threads a row (96 to
    480); rows a block and the grid stay ``tpr``'s. H100, kernels alone, L2 flushed (bench/diag_norm_whole_warps.py,
    bench/results/ops-norms-ww-h100-2026-12-05/): bf16 16384x3072 / 4096x5120 / 16384x5120 / 16384x6144 layer_norm
    1.01-1.06x, rms_norm 1.02-1.03x; 4096x6144 0.99x and 1.00x; float 16384x3072 1.01x."""
    vec = 16 // itemsize
    tpr = _pow2_at_least(_cdiv(max(cols, 1), ROW_CHUNKS * vec))
    limit = min(ROW_THREADS, props.max_threads_per_block)
    if tpr > limit:
        return row_plan(rows, cols, itemsize, 2, props)
    per_block = max(1, min(limit, NORM_BWD_BLOCK) // tpr)
    one_row = _cdiv(rows, per_block)
    exact = (_warps_of(cols, ROW_CHUNKS, itemsize) if itemsize in (2, 4) else 0) or tpr
    if per_block > 1 and one_row <= props.sm_count:  # few narrow rows: a row a row lane, a block an SM at most
        return Plan("persistent", (max(1, one_row),), (exact, per_block), 0, 0)
    resident = min(ROW_THREADS * ROW_BWD_BLOCKS, props.max_threads_per_sm)
    per_sm = max(1, resident // (tpr * per_block))
    grid = max(1, min(per_sm * props.sm_count, _cdiv(rows, 2 * per_block)))
    if one_row <= props.sm_count or rows * itemsize < NORM_SPLIT_BYTES * arrays * grid:  # see above
        return Plan("split", (max(1, one_row),), (exact, per_block), 0, 0)
    return Plan("persistent", (grid,), (exact, per_block), 0, 0)


@functools.lru_cache(maxsize=4096)
def col_sum_plan(cols: int, arrays: int) -> Plan:
    """norm_col_sum over ``arrays`` (1 or 2) arrays of partial sums, ``cols`` wide: blocks of 32
    columns x 32 row lanes, ``blockIdx.y`` the array."""
    return Plan("columns", (_cdiv(cols, 32), arrays), (32, 32), 0, 0)


@functools.lru_cache(maxsize=4096)
def weight_grad_plan(rows: int, cols: int, itemsize: int, props: DeviceProps) -> tuple[Plan, int]:
    """norm_bwd_weight: blocks of 32 column lanes of a 16-byte vector each x 8 row lanes, the rows split into chunks:
    about two blocks an SM, each row lane taking 1 to ``WEIGHT_LANE_ROWS`` rows (8: the most that measured faster, fewer
    chunks to add up, four rows' loads in flight). Up to two rows a lane, one chunk: its sums go straight to the
    gradients, no norm_col_sum (bf16 16x4096 on an H200: 4.9 us against 6.0). On sm_90+, inputs up to
    ``WEIGHT_CLUSTER_BYTES`` whose column blocks give ``WEIGHT_CLUSTER`` blocks at least half the SMs take
    ``"cluster"``: a cluster of that many chunks a column block (grid (chunks, column blocks)), whose sums meet in
    distributed shared memory, no partial sums in global memory and no norm_col_sum (bf16 1024x4096 layer_norm backward
    15.1 -> 13.3 us; 2048x4096: 26.7 against 33.3 with clusters, more chunks run faster there;
    bench/results/ops-norm-split-h200-2026-11-26/). Returns the plan and the rows per chunk."""
    col_blocks = _cdiv(cols, 32 * (16 // itemsize))
    lanes = 8
    if (props.clusters and rows > 2 * lanes and 2 * WEIGHT_CLUSTER * col_blocks >= props.sm_count
            and rows * cols * itemsize <= WEIGHT_CLUSTER_BYTES):
        per_chunk = _cdiv(rows, WEIGHT_CLUSTER)
        return Plan("cluster", (WEIGHT_CLUSTER, col_blocks), (32, lanes), 0, 0, WEIGHT_CLUSTER), per_chunk
    chunks = max(_cdiv(rows, WEIGHT_LANE_ROWS * lanes), min(_cdiv(2 * props.sm_count, col_blocks), _cdiv(rows, lanes)))
    chunks = 1 if rows <= 2 * lanes else max(1, min(chunks, 65535))
    per_chunk = _cdiv(rows, chunks)
    chunks = _cdiv(rows, per_chunk)
    return Plan("columns", (col_blocks, chunks), (32, lanes), 0, 0), per_chunk


@functools.lru_cache(maxsize=4096)
def norm_bwd_small_plan(rows: int, cols: int, itemsize: int, props: DeviceProps) -> Plan | None:
    """norm_small.cu's backwards (``"small"``: grad_x and the weight gradients in one launch) for 1 to
    ``SMALL_BWD_ROWS`` rows whose row lane (``ROW_CHUNKS`` 16-byte chunks a thread) fits a block of
    ``NORM_BWD_BLOCK`` threads, else None; the callers try it before ``norm_bwd_plan``. Blocks of
    ``NORM_BWD_BLOCK`` threads: ``tpr`` a row (as ``norm_bwd_plan``), the first ceil(rows / rows a block)
    writing grad_x, then the weight blocks of ``chunks`` column lanes (a 16-byte vector each) by
    NORM_BWD_BLOCK / ``chunks`` row lanes: the most lanes, up to 32, that leave a row lane at most
    ``WEIGHT_LANE_ROWS`` rows, but at least ``SMALL_MIN_LANES`` (64 bytes of a row together), no more than
    the row has, and 8 columns a block or more (the kernel adds a column up within a warp). At these sizes
    the persistent backward's partial sums and norm_col_sum's second launch cost more than reading the input
    twice (bench/results/ops-small-bwd-h100-2026-11-27/)."""
    vec = 16 // itemsize
    tpr = _pow2_at_least(_cdiv(max(cols, 1), ROW_CHUNKS * vec))
    if not 1 <= rows <= SMALL_BWD_ROWS or tpr > min(NORM_BWD_BLOCK, props.max_threads_per_block):
        return None
    col_vecs = _cdiv(cols, vec)
    lanes = 32
    while lanes > SMALL_MIN_LANES and _cdiv(rows, NORM_BWD_BLOCK // lanes) > WEIGHT_LANE_ROWS:
        lanes //= 2
    lanes = max(min(lanes, _pow2_at_least(col_vecs)), _cdiv(8, vec))
    per_block = NORM_BWD_BLOCK // tpr
    return Plan("small", (_cdiv(rows, per_block) + _cdiv(col_vecs, lanes),), (tpr, per_block), 0, 0, 1, lanes)


@functools.lru_cache(maxsize=4096)
def norm_bwd_c4_plan(rows: int, cols: int, itemsize: int, props: DeviceProps, arrays: int = 2) -> Plan | None:
    """norm.cu's ``layer_norm_bwd_c4`` (``arrays`` 2) / ``rms_norm_bwd_c4`` (1): the persistent backward at
    ``BWD_C4_CHUNKS`` 16-byte chunks a thread, a row a block of up to ``ROW_THREADS``, one block an SM (``grid``: the
    SMs, at most a block for two rows), for float rows in whole vectors too long for the 2-chunk kernels and short
    enough for 4 (4,097-8,192 columns; layer_norm's past ``BWD_C4_LN_MIN_ROW_BYTES``), which otherwise take a cluster
    of 2 (``norm_cluster_plan``); else None. Its weight-gradient sums and the weight live in ``shared_mem`` bytes of
    shared memory ([value][thread] at a stride of ``ROW_THREADS``), so that the registers hold this row and the next
    one: a whole row in flight an SM, where the cluster's blocks hold half and meet in distributed shared memory each
    row. H200 against the clusters (bench/diag_norm_bwd_c4.py, bench/results/ops-h200-2026-12-02/): float backwards
    1.01-1.25x, forward + backward 1.05-1.14x (layer_norm 16384x5120 0.98x: its rows fill 5/8 of the chunks); bf16
    rows of 10,240-16,384 0.79-1.17x, so 16-bit rows keep the clusters. The callers try it before ``norm_bwd_plan``,
    on 16-byte aligned tensors only."""
    vec = 16 // itemsize
    limit = min(ROW_THREADS, props.max_threads_per_block)
    if itemsize != 4 or cols % vec or _cdiv(cols, ROW_CHUNKS * vec) <= limit:
        return None
    if arrays == 2 and cols * itemsize <= BWD_C4_LN_MIN_ROW_BYTES:
        return None
    tpr = _pow2_at_least(_cdiv(cols // vec, BWD_C4_CHUNKS))
    smem = (arrays * vec * itemsize + 16) * BWD_C4_CHUNKS * ROW_THREADS  # the sums (float) and the weight
    if tpr > limit or smem > props.smem_per_block_optin or smem > props.smem_per_sm:
        return None
    return Plan("c4", (max(1, min(props.sm_count, _cdiv(rows, 2))),), (tpr, 1), smem, 0)


@functools.lru_cache(maxsize=4096)
def norm_bwd_sm_plan(rows: int, cols: int, itemsize: int, props: DeviceProps, arrays: int = 2) -> Plan | None:
    """norm.cu's ``rms_norm_bwd_sm`` (``arrays`` 1) / ``layer_norm_bwd_sm`` (2, float only): ``norm_bwd_plan``'s
    persistent rows of a row a block at more than ``ROW_THREADS / 2`` and at most ``BWD_SM_THREADS`` threads (their
    whole warps: 16-bit rows of 4,608 and 5,120 columns, float 2,304 and 2,560) at two blocks an SM (``grid``: twice
    the SMs, at most a block for two rows), else None. The persistent kernels take 114-126 registers a thread at
    16-bit rows (sm_90), so one block an SM, and the plan gives float rows one too; these hold their weight-gradient
    sums and the weight in ``shared_mem`` bytes of shared memory, as the 4-chunk backwards do ([value][thread] at a
    stride of ``ROW_THREADS``), and take at most 96 registers (``__launch_bounds__(BWD_SM_THREADS, 2)``, no spills).

    H200, kernels alone, L2 flushed, against the one-block kernels (bench/diag_norm_bwd_regs.py,
    bench/results/ops-bwd-sm-h200-2026-12-06/): rms_norm bf16 4096-32768 x 5120 1.12-1.19x, x 4608 1.21-1.23x;
    float 2,304 and 2,560 columns 1.20-1.27x (the float kernels at two blocks, 96 registers on sm_90 but 108 on
    sm_100, 1.21-1.27x). 16-bit layer_norm keeps the one-block kernels: its two sums a value in shared memory ran
    0.96-0.97x at 5,120 columns. The callers try it before ``norm_bwd_plan``, on 16-byte aligned tensors only."""
    vec = 16 // itemsize
    if itemsize not in (2, 4) or cols % vec or (itemsize == 2 and arrays == 2):
        return None
    p = norm_bwd_plan(rows, cols, itemsize, props, arrays)
    if p.strategy != "persistent" or p.block[1] != 1 or not ROW_THREADS // 2 < p.block[0] <= BWD_SM_THREADS:
        return None
    smem = (arrays * vec * 4 + 16) * ROW_CHUNKS * ROW_THREADS  # the float sums and the weight, ROW_CHUNKS chunks each
    if 2 * (smem + _STATIC_SMEM) > props.smem_per_sm or smem > props.smem_per_block_optin or \
            2 * p.block[0] > props.max_threads_per_sm:
        return None
    return Plan("sm", (max(1, min(2 * props.sm_count, _cdiv(rows, 2))),), p.block, smem, 0)
