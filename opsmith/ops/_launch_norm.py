"""The norm forwards' kernels beyond :func:`~opsmith.ops._launch.row_plan`'s strategy: layer_norm's wide
register rows (``layer_norm_kernel``), its float rows of one block of 4 chunks a thread
(``layer_norm_fwd4_plan``), the rows of 2 to 16 KiB that both take at 4 chunks a thread (``norm_c4_plan``;
16 KiB itself where the device's bandwidth an SM is low), the rows of 16 KiB or more that both read
twice, the second time from L2 (``norm_l2_plan``), and the rows too long for one block that a thread-block cluster
holds, both directions (``norm_cluster_plan``). Their numbers live in :mod:`opsmith.ops._launch` with
the others the C++ plans share; the norm backwards' plans are :mod:`opsmith.ops._launch_bwd`'s."""
from __future__ import annotations

import functools

from opsmith.ops._launch import (C4_MIN_ROW_BYTES, C4_THREADS, C8_FUSED_MAX_ROW_BYTES, C8_MAX_ROW_BYTES, C8K_THREADS,
                                 CLUSTER_FWD_BLOCKS, CLUSTER_MAX, CLUSTER_THREADS, L2_CHUNKS, L2_MIN_ROW_BYTES,
                                 L2_ONE_CHUNKS, L2_ONE_ROW_BYTES, L2_ONE_ROW_BYTES_HIGH_BW,
                                 L2_RMS_THREADS, L2_THREADS, L2_THREE_CHUNKS, L2_THREE_MAX_ROW_BYTES,
                                 L2_THREE_MAX_SM_GBPS, L2_THREE_THREADS, LN_FULL2_HIGH_BW_ROWS, LN_FULL2_MAX_ROW_BYTES,
                                 LN_FWD4_CHUNKS, LN_WIDE_TPR, LOW_BW_SM_GBPS, ROW_BWD_BLOCKS, ROW_CHUNKS, ROW_THREADS,
                                 WIDE_CHUNKS, DeviceProps, Plan, _cdiv, _cluster, _pow2_at_least, _threads_of,
                                 _whole_warps, full_rows, row_plan)

# add_layer_norm_l2_plan: one block an SM from rows of this many bytes where the bandwidth an SM is high (Python only:
# the add norms have no C++ plans, so it is not among _launch's shared numbers)
ADD_LN_ONE_ROW_BYTES = 65536

__all__ = ["add_layer_norm_l2_plan", "add_rms_c8_kernel", "add_rms_c8_plan", "high_bandwidth_per_sm", "l2_kernel",
           "layer_norm_full2_plan", "layer_norm_fwd4_plan", "layer_norm_kernel", "low_bandwidth_per_sm",
           "norm_c4_plan", "norm_c8_plan", "norm_cluster_plan", "norm_fwd_plan", "norm_l2_plan"]


@functools.lru_cache(maxsize=4096)
def norm_cluster_plan(rows: int, cols: int, itemsize: int, props: DeviceProps, backward: bool) -> Plan | None:
    """norm_cluster.cu's launch for rows too long for one block's registers (``row_plan``'s ``"long"``),
    on a device with clusters; None where the long kernels measured faster. A cluster holds a row,
    each block a slice of ``chunks`` 16-byte chunks a thread, the row spread evenly over whole
    warps:

    - ``K`` = 2 blocks of up to ``ROW_THREADS`` (bf16 rows up to 16,384, fp32 8,192), both directions;
    - forward, 16-bit rows up to twice that (32,768): ``K`` = 2 blocks of ``WIDE_CHUNKS`` (4) chunks a
      thread, one block of ``ROW_THREADS`` an SM (up to 128 registers a thread);
    - backward, rows up to twice that: ``K`` = ``CLUSTER_MAX`` (8) blocks of up to ``CLUSTER_THREADS``.

    H200, against the long kernels (bench/diag_norm_cluster.py; bench/results/ops-cluster-h200-2026-11-26/): K = 2
    ran bf16 forwards 1.16-1.96x and forward + backward 1.56-2.0x as fast, fp32 0.95-1.26x and 1.60-1.94x; the 4-chunk
    forwards 1.08x (bf16 rms_norm) and 1.69x (layer_norm), but 0.85-1.09x at fp32, which keeps long there; K = 8
    forwards ran 0.74-0.95x. H100, the backwards of 8 blocks of 512 threads on as many clusters as the device holds
    (_functional._resident), against long (bench/results/ops-fp32-rows-h100-2026-11-27/fp32rows3.json): fp32 2048x32768
    rms_norm 648.7 -> 293.2 us, layer_norm 660.5 -> 297.1; bf16 2048x65536 703.7 -> 307.6, 722.6 -> 482.9.
    Both directions are persistent: as many clusters as the SMs hold at once (``ROW_THREADS * CLUSTER_FWD_BLOCKS``
    threads an SM forward, ``ROW_THREADS * ROW_BWD_BLOCKS`` backward; the launch lowers that to the driver's count),
    at most one a row (two rows backward), striding over the rows; each backward cluster writes one row of partial
    sums."""
    if not props.clusters:
        return None
    units = _cdiv(max(cols, 1), ROW_CHUNKS * (16 // itemsize))  # threads a row needs
    limit = min(ROW_THREADS, props.max_threads_per_block)
    if units <= limit:
        return None
    vec = 16 // itemsize
    if units <= 2 * limit:
        k, chunks, blocks = 2, ROW_CHUNKS, ROW_BWD_BLOCKS if backward else CLUSTER_FWD_BLOCKS
    elif not backward and itemsize == 2 and _cdiv(cols, WIDE_CHUNKS * vec) <= 2 * limit:
        k, chunks, blocks = 2, WIDE_CHUNKS, 1
    elif backward and units <= CLUSTER_MAX * min(CLUSTER_THREADS, limit):
        k, chunks, blocks = CLUSTER_MAX, ROW_CHUNKS, ROW_BWD_BLOCKS
    else:
        return None
    return _cluster(rows, cols, itemsize, props, k, chunks, blocks, _cdiv(rows, 2) if backward else rows)


def low_bandwidth_per_sm(props: DeviceProps) -> bool:
    """Whether ``props``' DRAM bandwidth is known and at most ``LOW_BW_SM_GBPS`` an SM (H100 25: yes; H200 36,
    B200 52, a device that does not report it: no). Such a device fills its DRAM with fewer bytes in flight an SM:
    the forwards' plans that hold fewer (c4 at 16 KiB rows, c8, layer_norm's full2) win there and lose elsewhere."""
    return 0 < props.mem_gbps <= LOW_BW_SM_GBPS * props.sm_count


def high_bandwidth_per_sm(props: DeviceProps) -> bool:
    """Whether ``props``' DRAM bandwidth is known and more than ``LOW_BW_SM_GBPS`` an SM (the H200, the B200; not the
    H100, nor a device that does not report it): where the L2 rows of 96 KiB keep two blocks an SM, and the rows of
    16-32 KiB (up to ``L2_THREE_MAX_SM_GBPS``) and add_layer_norm's from 64 KiB take their own kernels."""
    return props.mem_gbps > 0 and not low_bandwidth_per_sm(props)


@functools.lru_cache(maxsize=4096)
def norm_fwd_plan(rows: int, cols: int, itemsize: int, props: DeviceProps) -> Plan:
    """The norm forwards' plan by their rows' strategy (the kernels of 4 and 8 chunks a thread and the L2 rows come
    first, in the callers): ``row_plan``'s register rows, those that are whole warps of their chunks at exactly those
    threads (:func:`~opsmith.ops._launch._whole_warps`: float rms_norm's and add_rms_norm's rows of 768-3,840
    columns in steps of 256 but the powers of two, 16-bit add_rms_norm's twice those; 96 to 480 threads, each row
    filling its threads' chunks), else the clusters (``norm_cluster_plan``), else ``row_plan``'s long rows. H100,
    kernels alone (bench/results/ops-norms-ww-h100-2026-12-05/whole-warps.json): float rms_norm 16384x3072 143.0 ->
    135.3 us; add_rms_norm 0.993-1.040x."""
    plan = row_plan(rows, cols, itemsize, 1, props)
    if plan.strategy != "long":
        return _whole_warps(plan, cols, itemsize)
    return norm_cluster_plan(rows, cols, itemsize, props, False) or plan


@functools.lru_cache(maxsize=4096)
def layer_norm_fwd4_plan(rows: int, cols: int, itemsize: int, props: DeviceProps) -> Plan | None:
    """norm.cu's ``layer_norm_fwd4`` (``LN_FWD4_CHUNKS`` 16-byte chunks a thread, one block a row)
    for float rows too long for the register strategy that fit a block that way (4,097-8,192
    elements) in whole 16-byte vectors, else None. On an H200 (bench/diag_ln_fwd4.py) it ran them
    faster than the 2-block clusters: fp32 8192x8192 2,800 -> 3,909 GB/s, 16384x6144 2,883 -> 3,323,
    65536x5000 2,942 -> 2,991; a width of odd elements (2048x4097: element access) ran slower,
    1,375 against 1,770, and so did 16-bit rows (they keep the clusters)."""
    if itemsize != 4 or cols % (16 // itemsize):
        return None
    limit = min(ROW_THREADS, props.max_threads_per_block)
    vec = 16 // itemsize
    if cols <= ROW_CHUNKS * vec * limit or cols > LN_FWD4_CHUNKS * vec * limit:
        return None
    return Plan("block", (max(1, rows),), (_pow2_at_least(_cdiv(cols, LN_FWD4_CHUNKS * vec)), 1), 0, 0)


@functools.lru_cache(maxsize=4096)
def norm_c4_plan(rows: int, cols: int, itemsize: int, props: DeviceProps, arrays: int = 2) -> Plan | None:
    """norm.cu's ``layer_norm_fwd_c4`` (``arrays`` 2) / ``rms_norm_fwd_c4`` (1): a block a row of 4 chunks a
    thread, half the threads of the register rows' 2, for rows of ``C4_MIN_ROW_BYTES`` up to
    ``L2_MIN_ROW_BYTES`` in whole 16-byte vectors of 2-byte types, and of float for layer_norm; else None.
    H200, kernels alone (bench/results/ops-fwd-c4-h200-2026-11-26/), GB/s before -> after: bf16 layer_norm
    65536x1024 3,208 -> 3,838, 16384x2048 3,008 -> 3,493, 16384x4096 3,289 -> 3,573; rms_norm 4096x4096
    3,531 -> 3,636, 2048x8192 3,434 -> 3,632; float layer_norm 65536x1024 3,705 -> 4,051. Float rms_norm ran
    as fast or up to 1.5 % slower (it keeps 2), and so did several rows a block.

    Rows of exactly ``L2_MIN_ROW_BYTES`` (bf16 8,192, float 4,096) too: layer_norm's (``arrays`` 2) on every
    device, rms_norm's where the device's DRAM bandwidth is at most ``LOW_BW_SM_GBPS`` an SM
    (:func:`low_bandwidth_per_sm`); the callers try this plan before ``norm_l2_plan``. bench/diag_fwd_16k.py
    (bench/results/ops-h100-2026-11-27/), GB/s of the two plans at those rows, L2 flushed: H100 (25 GB/s an SM)
    layer_norm 1.07-1.14x the L2 rows', rms_norm 1.00-1.09x; H200 (36 GB/s an SM) then 0.94-1.03x and 0.96-1.05x.
    Since layer_norm's 4-chunk rows read w and b a chunk at a time, the H200 runs them 1.06-1.07x the L2 rows'
    (bf16 8192x8192, 32768x8192, fp32 16384x4096; bench/results/ops-h200-2026-12-01/plans-rules-h200.json), and
    rms_norm's 0.98-1.00x: its L2 rows keep more bytes in flight. A device whose bandwidth is not known keeps
    rms_norm's L2 rows.

    layer_norm's callers try :func:`layer_norm_full2_plan` first: its 16-bit rows of 2 to 4 KiB that fill 2 chunks
    a thread (aligned) run faster at 2 chunks.

    Rows that are whole warps of 4 chunks a thread fewer than the next power of two (bf16 3,072, 5,120, 6,144 and
    7,168 columns; float 1,536, 2,560, 3,072, 3,584) take exactly those threads (96, 160, 192, 224), not the power of
    two, so that each row fills its threads' chunks (the unchecked ``_full`` kernels) and no thread idles, as
    softmax's ``_launch._whole_warps``. H100, kernels alone, L2 flushed (bench/diag_norm_whole_warps.py,
    bench/results/ops-norms-ww-h100-2026-12-05/): bf16 layer_norm 16384x3072 78.4 -> 70.9 us, 4096x5120 41.8 ->
    32.2, 16384x5120 151.4 -> 116.7, 16384x6144 161.8 -> 138.6; rms_norm 1.02-1.09x; float layer_norm 16384x3072
    146.9 -> 137.8."""
    vec = 16 // itemsize
    if itemsize not in ((2, 4) if arrays == 2 else (2,)) or cols % vec:
        return None
    top = L2_MIN_ROW_BYTES if arrays == 2 or low_bandwidth_per_sm(props) else L2_MIN_ROW_BYTES - 1
    if not C4_MIN_ROW_BYTES <= cols * itemsize <= top:
        return None
    tpr = _threads_of(cols, 4, itemsize)  # whole warps: exactly theirs
    if tpr > min(C4_THREADS, props.max_threads_per_block):
        return None
    return Plan("block", (max(1, rows),), (tpr, 1), 0, 0)


@functools.lru_cache(maxsize=4096)
def layer_norm_full2_plan(rows: int, cols: int, itemsize: int, props: DeviceProps) -> Plan | None:
    """norm.cu's ``layer_norm_fwd_full``: layer_norm's 16-bit rows of ``C4_MIN_ROW_BYTES`` to
    ``LN_FULL2_MAX_ROW_BYTES`` that fill :func:`~opsmith.ops._launch.row_plan`'s threads at ``ROW_CHUNKS`` chunks
    each (the power-of-two widths), else None; the caller adds the pointers' alignment and tries it before
    :func:`norm_c4_plan`. The unchecked row at 2 chunks holds 56 registers where the 4-chunk one holds 80. H100, L2
    flushed (bench/diag_full_rows.py, two runs), against layer_norm_fwd_c4_full: bf16 2048x2048 1.09-1.12x, 2048x1024
    1.04x, 65536x1024 1.01x, 16384x2048 1.00x, 512x1024 0.98x; from 4,096 columns 0.82-0.94x. On devices of more
    DRAM bandwidth an SM (not :func:`low_bandwidth_per_sm`) only up to ``LN_FULL2_HIGH_BW_ROWS`` rows: H200
    (bench/diag_plans_bw.py, bench/results/ops-h200-2026-12-01/plans-rules-h200.json) 1.08-1.15x c4's on 256 to
    4,096 rows of 1,024 and 256 to 1,024 of 2,048 (2048x2048 0.96x, 4096x2048 1.02x), 0.93-0.98x at 8,192 rows and
    0.85-0.89x at 65,536 (bf16 65536x2048 3,443 against 4,040 GB/s)."""
    if itemsize != 2 or not C4_MIN_ROW_BYTES <= cols * itemsize <= LN_FULL2_MAX_ROW_BYTES \
            or (not low_bandwidth_per_sm(props) and rows > LN_FULL2_HIGH_BW_ROWS):
        return None
    p = row_plan(rows, cols, itemsize, 1, props)
    return p if full_rows(p, cols, itemsize, True) else None


@functools.lru_cache(maxsize=4096)
def norm_c8_plan(rows: int, cols: int, itemsize: int, props: DeviceProps) -> Plan | None:
    """norm.cu's ``layer_norm_fwd_c8`` / ``rms_norm_fwd_c8``: a block a row of 8 chunks a thread (at most
    ``C4_THREADS`` threads), the row read once, for rows of more than ``L2_MIN_ROW_BYTES`` up to
    ``C8_MAX_ROW_BYTES`` in whole 16-byte vectors of 2- and 4-byte types, else None; the callers try it after
    ``norm_c4_plan`` and before ``norm_l2_plan`` (the row read twice, the second time from L2). H100, kernels
    alone (bench/diag_fwd_long1.py), the 32 KiB rows 1.01-1.06x the L2 rows'; at 64 KiB rms_norm 1.01-1.02x and
    bf16 layer_norm 0.90x (it spills), which keep the L2 rows. On devices of more DRAM bandwidth an SM
    (:func:`low_bandwidth_per_sm`) it declines: H200 (bench/diag_plans_bw.py,
    bench/results/ops-h200-2026-12-01/plans-h200.json) against the L2 rows, bf16 32 KiB rows layer_norm 0.95-0.96x,
    rms_norm 0.96-1.00x; fp32 24 KiB (16384x6144) 0.90x and 0.91x; fp32 32 KiB layer_norm 0.99-1.01x, rms_norm
    1.02x. (add_rms_norm's rows keep theirs there: 1.04-1.06x.)"""
    if not low_bandwidth_per_sm(props):
        return None
    return _c8(rows, cols, itemsize, props, C8_MAX_ROW_BYTES, C4_THREADS)


@functools.lru_cache(maxsize=4096)
def add_rms_c8_plan(rows: int, cols: int, itemsize: int, props: DeviceProps) -> Plan | None:
    """fused_norm.cu's ``add_rms_norm_fwd_c8`` (blocks of up to ``C4_THREADS``) / ``add_rms_norm_fwd_c8k`` (up to
    ``C8K_THREADS``): a block a row of 8 chunks a thread, the row read once, for add_rms_norm's rows of more than
    ``L2_MIN_ROW_BYTES`` up to ``C8_FUSED_MAX_ROW_BYTES`` in whole 16-byte vectors of 2- and 4-byte types, else
    None; the caller (which checks every pointer's alignment) tries it before ``norm_l2_plan``. H100, kernels alone
    (bench/results/ops-c8-h100-2026-11-27/long1.json): 1.026-1.036x the L2 rows' GB/s at 32 and 64 KiB (128
    registers, no spills; layer_norm and rms_norm keep the L2 rows at 64 KiB, where they spill or gain 1 %). On
    every device: H200 (bench/results/ops-h200-2026-12-01/plans-h200.json) 1.04-1.06x the L2 rows' at 32-64 KiB."""
    return _c8(rows, cols, itemsize, props, C8_FUSED_MAX_ROW_BYTES, C8K_THREADS)


def _c8(rows: int, cols: int, itemsize: int, props: DeviceProps, top: int, threads: int) -> Plan | None:
    """A block a row of 8 chunks a thread for rows of more than L2_MIN_ROW_BYTES up to ``top`` bytes in whole
    16-byte vectors of 2- and 4-byte types within ``threads`` (the kernels' launch bounds), else None: the least power
    of two threads that holds the row, or exactly the threads of a row that is whole warps of 8 chunks (bf16 10,240,
    12,288, 14,336 columns: 160, 192, 224 threads; float half those; as :func:`norm_c4_plan`)."""
    vec = 16 // itemsize
    if itemsize not in (2, 4) or cols % vec or not L2_MIN_ROW_BYTES < cols * itemsize <= top:
        return None
    tpr = _threads_of(cols, 8, itemsize)  # whole warps: exactly theirs
    if tpr > min(threads, props.max_threads_per_block):
        return None
    return Plan("block", (max(1, rows),), (tpr, 1), 0, 0)


def add_rms_c8_kernel(plan: Plan) -> str:
    """The kernel of ``add_rms_c8_plan``'s ``plan``: the 2-blocks-an-SM one up to ``C4_THREADS`` threads."""
    return "add_rms_norm_fwd_c8" if plan.block[0] <= C4_THREADS else "add_rms_norm_fwd_c8k"


@functools.lru_cache(maxsize=4096)
def norm_l2_plan(rows: int, cols: int, itemsize: int, props: DeviceProps, arrays: int = 2) -> Plan | None:
    """norm_l2.cu's forwards (``"l2"``: a block a row of about ``L2_CHUNKS`` chunks a thread, 32
    registers, the row read twice, the second time from L2) for rows of ``L2_MIN_ROW_BYTES`` or more in
    whole 16-byte vectors of 2- and 4-byte types (the caller checks the pointers' alignment), else
    None. ``arrays``: 2 layer_norm (weight and bias), 1 rms_norm, whose blocks take at least
    ``L2_RMS_THREADS`` threads (fewer chunks a thread on its shortest rows). H200
    (bench/diag_norm_l2.py), GB/s before -> after: bf16 layer_norm 4096x16384 2,574 -> 3,514,
    2048x32768 2,859 -> 3,279, 8192x8192 3,063 -> 3,549; rms_norm 4096x16384 3,441 -> 3,935; fp32
    rms_norm 8192x8192 3,221 -> 4,055. At 8 KiB rows (bf16 4,096) the register rows ran as fast. The
    launch-variant sweep (bench/results/ops-norm-l2-h200-2026-11-26/variants.txt) at 16 KiB rows: 256
    threads for layer_norm (bf16 8192x8192 3,549 against 3,165 at 512), 512 for rms_norm (fp32
    16384x4096 4,160 against 3,887 at 256).

    Rows of more than ``L2_ONE_ROW_BYTES`` (``L2_ONE_ROW_BYTES_HIGH_BW`` where the device's DRAM bandwidth an SM is known
    and not :func:`low_bandwidth_per_sm`: H200, kernels alone, bench/results/ops-h200-2026-12-03/fwd128k.json, fp32
    4096x24576 (96 KiB) two blocks an SM 1.19x one block's for layer_norm, 1.08x for rms_norm; at 128 KiB 0.91-0.97x)
    take one block an SM where the block is of ``L2_THREADS`` (``Plan.chunks``
    ``L2_ONE_CHUNKS``; :func:`l2_kernel`: the kernels of ``B`` = 1, 4 chunks a trip, whose 48-64 registers a thread
    keep a second block of 1,024 out): two rows of 128 KiB an SM overflow L2 before their second pass. H100
    (bench/results/ops-fp32-rows-h100-2026-11-27/l2one.json), GB/s against two blocks of 2 chunks a trip: fp32
    2048x32768 rms_norm 2,268 -> 2,728, layer_norm 2,261 -> 2,549, add_rms_norm 2,643 -> 2,828 (fp32rows2.json: 2,643
    at two blocks); 4096x24576 (96 KiB) rms_norm 2,580 -> 2,772, layer_norm 2,573 -> 2,549; bf16 2048x65536 rms_norm
    2,269 -> 2,676, layer_norm 2,229 -> 2,494. At 80 KiB (fp32 4096x20480) and 64 KiB the rows ran slower this way
    (rms_norm 0.97x and 0.95x, layer_norm 0.84x and 0.89x). Unused dynamic shared memory (half an SM's) kept the second
    block out until the registers did (bench/results/ops-l2-weights-h100-2026-11-27/ln3.json, the kernels of this tree
    with and without it: fp32 2048x32768 layer_norm 2,677 -> 2,726 GB/s, rms_norm 2,774 -> 2,792; bf16 2048x65536
    layer_norm 2,608 -> 2,660): L1 keeps its size.

    Rows of more than ``L2_MIN_ROW_BYTES`` up to ``L2_THREE_MAX_ROW_BYTES`` (16-32 KiB) of rms_norm (``arrays`` 1), and
    of float layer_norm, in blocks of ``L2_THREE_THREADS`` (512) where the device's DRAM bandwidth an SM is known, not
    low (there :func:`norm_c8_plan` declines them) and at most ``L2_THREE_MAX_SM_GBPS`` take the kernels of ``B`` = 3
    (``Plan.chunks`` ``L2_THREE_CHUNKS``): 3 blocks an SM at 40 registers, 4 chunks a trip, so a row of 32 KiB takes
    one trip a pass. (The B200, 52 GB/s an SM, keeps ``B`` = 2: sm_100's ptxas spills 20-60 bytes in these kernels,
    and no B200 was at hand to measure them.)
    H200 (bench/diag_fwd_l2_trips.py, bench/results/ops-h200-2026-12-04/trips.txt) against ``B`` = 2's 2 chunks a trip:
    fp32 8,192 columns rms_norm 1.03-1.05x, layer_norm 1.01-1.02x, bf16 16,384 rms_norm 1.03x; bf16 layer_norm there
    0.98-1.00x (it keeps ``B`` = 2), rows of 16 KiB as fast."""
    vec = 16 // itemsize
    if itemsize not in (2, 4) or cols % vec or cols * itemsize < L2_MIN_ROW_BYTES or not 1 <= rows < 2**31:
        return None  # (a block a row: the kernels have no loop over rows, which cost them registers)
    largest = min(L2_THREADS, _pow2_at_least(props.max_threads_per_block + 1) // 2)
    threads = _pow2_at_least(_cdiv(cols // vec, L2_CHUNKS))
    if arrays == 1:
        threads = max(threads, min(L2_RMS_THREADS, _pow2_at_least(_cdiv(cols // vec, 2))))
    high = high_bandwidth_per_sm(props)
    one_bytes = L2_ONE_ROW_BYTES_HIGH_BW if high else L2_ONE_ROW_BYTES
    bx = min(largest, threads)
    chunks = L2_ONE_CHUNKS if cols * itemsize > one_bytes and bx == L2_THREADS else 0
    if high and props.mem_gbps <= L2_THREE_MAX_SM_GBPS * props.sm_count and bx == L2_THREE_THREADS \
            and L2_MIN_ROW_BYTES < cols * itemsize <= L2_THREE_MAX_ROW_BYTES and (arrays == 1 or itemsize == 4):
        chunks = L2_THREE_CHUNKS
    return Plan("l2", (rows,), (bx, 1), 0, 0, 1, chunks)


@functools.lru_cache(maxsize=4096)
def add_layer_norm_l2_plan(rows: int, cols: int, itemsize: int, props: DeviceProps) -> Plan | None:
    """add_layer_norm's L2 rows: :func:`norm_l2_plan`'s (``arrays`` 2), but where the device's DRAM bandwidth an SM is
    known and not low, one block an SM (``B`` = 1, ``Plan.chunks`` ``L2_ONE_CHUNKS``) from rows of
    ``ADD_LN_ONE_ROW_BYTES`` (64 KiB) in blocks of ``L2_THREADS``, where layer_norm keeps two up to 96 KiB: its first
    pass reads x and residual and writes s, twice layer_norm's bytes in flight. H200 (bench/diag_fwd_128k.py,
    bench/results/ops-h200-2026-12-04/final.txt), GB/s of ``B`` = 1 against 2, one run: fp32 4096x16384 3,792 -> 3,890,
    8192x16384 3,835 -> 3,930, bf16 4096x32768 3,752 -> 3,811; at 96 KiB (fp32 4096x24576) as fast (3,728 -> 3,738).
    add_rms_norm keeps its own rows (:func:`add_rms_c8_plan` to 64 KiB: 3,974-4,009 at ``B`` = 1 against 4,138-4,185).
    No C++ twin: the add norms run from Python only."""
    p = norm_l2_plan(rows, cols, itemsize, props, 2)
    if p is None or p.chunks or p.block[0] != L2_THREADS or cols * itemsize < ADD_LN_ONE_ROW_BYTES:
        return p
    return p._replace(chunks=L2_ONE_CHUNKS) if high_bandwidth_per_sm(props) else p


def l2_kernel(op: str, plan: Plan) -> str:
    """norm_l2.cu's forward of ``op`` (``"rms_norm"``, ``"layer_norm"``, ``"add_rms_norm"``, ``"add_layer_norm"``) for
    ``norm_l2_plan``'s ``plan``: where the plan's ``chunks`` are set, ``B`` = 1 (one block of ``L2_THREADS`` an SM) or,
    in blocks of ``L2_THREE_THREADS``, ``B`` = 3 (3 blocks an SM, ``L2_THREE_CHUNKS`` a trip; the add norms, not
    measured so, keep ``B`` = 2 there: their row takes 1 chunk of x and of residual a trip); else 2."""
    if not plan.chunks:
        return f"{op}_fwd_l2<2, {{T}}, {{A}}>"
    if plan.block[0] == L2_THREADS:
        return f"{op}_fwd_l2<1, {{T}}, {{A}}>"
    return f"{op}_fwd_l2<{2 if op.startswith('add_') else 3}, {{T}}, {{A}}>"


def layer_norm_kernel(plan: Plan, vec: bool) -> str:
    """The forward kernel of layer_norm for ``plan`` (``row_plan``'s): ``layer_norm_fwd_wide`` (w and b
    read after the reductions, 3 blocks of ROW_THREADS an SM) where a row has ``LN_WIDE_TPR`` threads
    or more and ``vec`` (16-byte access: the width a multiple of 16 bytes, every pointer aligned), where
    it measured faster; ``layer_norm_fwd`` elsewhere (norm.cu says by how much). The callers try
    ``norm_l2_plan`` and ``norm_c4_plan`` first, so the wide kernel's rows are float64's."""
    if plan.strategy == "long":
        return "layer_norm_fwd_long"
    return "layer_norm_fwd_wide" if vec and plan.strategy == "block" and plan.block[0] >= LN_WIDE_TPR \
        else "layer_norm_fwd"
