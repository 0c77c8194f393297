"""Launch configurations of the opsmith.ops kernels, from the shape and the device's properties.

Nothing here is tuned for one GPU: block sizes are the kernels' own limits (``__launch_bounds__``), grids come from
the SM count and the threads an SM holds, the long-row strategy caches a row in shared memory when the device's
opt-in limit allows. Plans are cached per shape class (``functools.lru_cache`` on the shape and the properties).

Row strategies (see ``kernels/softmax.cu``):

- ``"warp"``: the row fits in the registers of at most 32 threads: ``tpr`` threads per row, several rows per block;
- ``"block"``: the row fits in the registers of up to ``ROW_THREADS`` threads: one row per block;
- ``"long"``: longer rows: one block of up to ``LONG_THREADS`` threads per row, grid-stride
  over rows, the row staged in shared memory when ``arrays`` rows of it fit, else read again;
- ``"wide"`` (softmax only, ``softmax_plan``): rows beyond ``"block"`` that fit ``LONG_THREADS``
  threads of ``WIDE_CHUNKS`` chunks: one block a row, the row in registers;
- ``"cluster"`` (the norms, ``_launch_norm.norm_cluster_plan``, and softmax, sm_90+): rows beyond ``"block"`` that
  fit 2 blocks of ``ROW_THREADS`` (and, backward, ``CLUSTER_MAX`` of ``CLUSTER_THREADS``): a thread-block cluster a
  row, each block a slice of it in registers, the row's sums through distributed shared memory.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

__all__ = [
    "EW_THREADS", "LN_WIDE_TPR", "LONG_THREADS", "ROW_BWD_BLOCKS", "ROW_CHUNKS", "ROW_THREADS", "WIDE_CHUNKS",
    "CLUSTER_FWD_BLOCKS", "CLUSTER_MAX", "CLUSTER_THREADS", "DeviceProps", "Plan", "device_props",
    "elementwise_plan", "ew_unrolled", "launch_config", "row_plan",
    "full_rows", "softmax_fwd_kernel", "softmax_fwd_wide3", "softmax_plan"
]

# The kernels' compile-time numbers (common.cuh, rows.cuh, elementwise.cu, softmax.cu, norm.cu).
ROW_CHUNKS = 2        # OPSMITH_ROW_CHUNKS: 16-byte vectors per thread and input in registers
ROW_THREADS = 512     # OPSMITH_ROW_THREADS: __launch_bounds__ of the register-row kernels
ROW_BWD_BLOCKS = 1    # OPSMITH_ROW_BWD_BLOCKS in norm_bwd.cuh: ROW_THREADS-blocks an SM holds in the norm backwards
NORM_BWD_BLOCK = 256  # OPSMITH_BWD_BLOCK in norm_bwd.cuh: threads of a persistent backward block of several rows
BWD_C4_CHUNKS, BWD_C4_LN_MIN_ROW_BYTES = 4, 20 << 10  # _launch_bwd.norm_bwd_c4_plan (norm.cu's *_bwd_c4)
BWD_SM_THREADS = 320  # OPSMITH_BWD_SM_THREADS in norm_bwd.cuh: the most threads of norm_bwd_sm_plan's rows
LN_WIDE_TPR = 256     # layer_norm_fwd_wide (norm.cu) serves register rows of this many threads or more
LN_FWD4_CHUNKS = 4    # layer_norm_fwd4 (norm.cu): 16-byte chunks a thread (layer_norm_fwd4_plan)
LONG_THREADS = 1024   # OPSMITH_LONG_THREADS: __launch_bounds__ of the long-row kernels
WIDE_CHUNKS = 4       # OPSMITH_WIDE_CHUNKS in softmax.cu: 16-byte chunks a thread in softmax_fwd_wide
WIDE8_CHUNKS = 2 * WIDE_CHUNKS  # softmax_{fwd,bwd}_wide<T, 8>: the float rows past WIDE_CHUNKS (Plan.chunks)
WIDE3_THREADS = 512   # OPSMITH_WIDE3_THREADS in softmax.cu: the wide forward's rows softmax_fwd_wide3 takes
EW_THREADS = 256      # OPSMITH_EW_THREADS: __launch_bounds__ of the elementwise kernels
EW_UNROLL = 4         # OPSMITH_EW_UNROLL in elementwise.cu: vectors in flight per thread per trip
CLUSTER_MAX = 8       # the larger cluster of norm_cluster.cu's kernels (K = 2 or 8; 8 is the portable limit)
CLUSTER_THREADS = 512 # the most threads a block of _launch_norm.norm_cluster_plan's clusters of CLUSTER_MAX
CLUSTER_FWD_BLOCKS = 2  # ROW_THREADS-blocks an SM holds in the 2-chunk cluster kernels (their __launch_bounds__)
NORM_SPLIT_BYTES = 12  # norm_bwd_plan: "split" below this many bytes a column a block and array of partial sums
WEIGHT_LANE_ROWS = 8   # weight_grad_plan: the most rows a row lane of norm_bwd_weight takes (more: more chunks)
WEIGHT_CLUSTER = 8     # OPSMITH_WEIGHT_CLUSTER in norm_split.cu: chunks of rows (blocks) a cluster (norm_bwd_weight)
WEIGHT_CLUSTER_BYTES = 8 << 20  # weight_grad_plan: clusters for inputs up to this size (larger: more chunks ran faster)
L2_THREADS = 1024     # OPSMITH_L2_THREADS in norm_l2.cu: the most threads a block of norm_l2_plan's
L2_CHUNKS = 4         # norm_l2_plan: 16-byte chunks a thread a row, about
L2_MIN_ROW_BYTES = 16384  # norm_l2_plan: rows of at least this many bytes
L2_RMS_THREADS = 512  # norm_l2_plan: rms_norm's blocks take at least this many threads (up to 2 chunks each)
L2_ONE_ROW_BYTES, L2_ONE_ROW_BYTES_HIGH_BW = 80 << 10, 96 << 10  # norm_l2_plan: one block an SM past (B = 1)
L2_ONE_CHUNKS = 4     # OPSMITH_L2_UNROLL_ONE in norm_l2.cu: B = 1's chunks a trip (norm_l2_plan's Plan.chunks)
L2_THREE_THREADS = 512  # OPSMITH_L2_THREADS_THREE in norm_l2.cu: the threads a block of B = 3 (3 blocks an SM)
L2_THREE_CHUNKS = 4   # OPSMITH_L2_UNROLL_THREE in norm_l2.cu: B = 3's chunks a trip (norm_l2_plan's Plan.chunks)
L2_THREE_MAX_ROW_BYTES = 32768  # norm_l2_plan: B = 3 for rows past L2_MIN_ROW_BYTES up to this (high bandwidth an SM)
L2_THREE_MAX_SM_GBPS = 45  # norm_l2_plan: B = 3 up to this DRAM GB/s an SM (H200 36; the B200's 52: unmeasured)
C4_THREADS = 256      # OPSMITH_C4_THREADS in norm.cu (softmax.cu): the most threads a block of *_fwd_c4 (wide_full)
C4_MIN_ROW_BYTES = 2048  # norm_c4_plan and softmax_plan's forward: 4 chunks a thread from rows of this many bytes
LN_FULL2_MAX_ROW_BYTES = 4096  # layer_norm_full2_plan: layer_norm's 16-bit rows up to this at 2 chunks a thread, full
LOW_BW_SM_GBPS = 30  # _launch_norm.low_bandwidth_per_sm: at most this DRAM GB/s an SM (H100 25, H200 36)
LN_FULL2_HIGH_BW_ROWS = 4096  # layer_norm_full2_plan: its rows on the other devices, at most this many
SMALL_BWD_ROWS = 1024  # norm_bwd_small_plan: the norm backwards of 1 to this many rows take norm_small.cu's one launch
C8_MAX_ROW_BYTES = 32768  # norm_c8_plan: norm forward rows past L2_MIN_ROW_BYTES up to this: 8 chunks a thread
C8K_THREADS = 512     # OPSMITH_C8K_THREADS in fused_norm.cu: add_rms_c8_plan's most threads (64 KiB rows)
C8_FUSED_MAX_ROW_BYTES = 65536  # add_rms_c8_plan: add_rms_norm's forward rows up to this: 8 chunks a thread
SMALL_MIN_LANES = 4   # norm_bwd_small_plan: the fewest column lanes (16-byte vectors of a row) of its weight blocks
_STATIC_SMEM = 1024   # the reductions' static shared memory, at most (2 x 32 doubles), rounded up
_WARP = 32


class DeviceProps(NamedTuple):
    """What a launch plan needs to know about a device (a value: plans are cached by it)."""

    sm_count: int
    max_threads_per_block: int
    max_threads_per_sm: int
    smem_per_block_optin: int
    smem_per_sm: int
    clusters: bool = False  # thread-block clusters (compute capability 9.0+)
    mem_gbps: int = 0  # peak DRAM bandwidth in GB/s, from the memory's clock and bus width (0: not known)


class Plan(NamedTuple):
    """A launch: strategy name, grid, block, dynamic shared memory, the kernel's ``cache`` flag."""

    strategy: str
    grid: tuple
    block: tuple
    shared_mem: int
    cache: int
    cluster: int = 1  # blocks a cluster ("cluster": the kernel's K, its __cluster_dims__)
    chunks: int = 0   # 16-byte chunks a thread: "cluster" (the forward kernels' 2nd template argument); "l2": a trip
    #                   of B = 1 (blocks of L2_THREADS) or 3 (of L2_THREE_THREADS), 0: B = 2 (_launch_norm.l2_kernel)


# One LaunchConfig per plan, so that its id stays stable (the launcher remembers validated
# configs by id) and no config is built per call.
_configs: dict[Plan, object] = {}


def launch_config(plan: Plan):
    """The :class:`~opsmith.LaunchConfig` of ``plan`` (one object per plan)."""
    cfg = _configs.get(plan)
    if cfg is None:
        from opsmith._runtime._launch_config import LaunchConfig
        cfg = _configs.setdefault(plan, LaunchConfig(plan.grid, plan.block, plan.shared_mem))
    return cfg


@functools.cache
def device_props(device: int) -> DeviceProps:
    """The properties of CUDA ``device`` that plans use, from ``torch.cuda.get_device_properties``."""
    import torch
    p = torch.cuda.get_device_properties(device)
    optin = getattr(p, "shared_memory_per_block_optin", 0) or getattr(p, "shared_memory_per_block", 48 * 1024)
    return DeviceProps(
        sm_count=p.multi_processor_count,
        max_threads_per_block=getattr(p, "max_threads_per_block", 1024) or 1024,
        max_threads_per_sm=getattr(p, "max_threads_per_multi_processor", 2048) or 2048,
        smem_per_block_optin=int(optin),
        smem_per_sm=int(getattr(p, "shared_memory_per_multiprocessor", optin) or optin),
        clusters=p.major >= 9,
        mem_gbps=_mem_gbps(p))


def _mem_gbps(p) -> int:
    """Peak DRAM bandwidth of torch device properties ``p`` in GB/s: two transfers a clock (kHz) of the bus's
    bytes (the device tool's H100 3,352, H200 4,814); 0 where torch does not report the memory's clock and bus."""
    clock_khz, bits = getattr(p, "memory_clock_rate", 0) or 0, getattr(p, "memory_bus_width", 0) or 0
    return int(clock_khz * bits // 4_000_000)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@functools.lru_cache(maxsize=4096)
def elementwise_plan(n: int, itemsize: int, props: DeviceProps, unrolled: bool = False) -> Plan:
    """elementwise.cu's launch over ``n`` elements of ``itemsize`` bytes: blocks of ``EW_THREADS``, one
    16-byte vector a thread. ``unrolled`` (:func:`ew_unrolled`): from half a wave of blocks, one trip of
    the kernel's unrolled loop a thread instead, ``EW_UNROLL`` vectors in flight each.

    Measured on the H200 from 2 to 512 MiB moved (``bench/diag_ew_map.py``): one vector a thread was
    the fastest map for relu, both GELUs and silu, forward and backward, fp32 and bf16, up to 1.3× the
    unrolled trip at 2–8 MiB; but the erf GELU's bf16 forward ran 1.06–1.19× faster unrolled from 32 MiB
    (its erf's many instructions amortise a trip's index math), and 0.70–0.88× at 2–8 MiB (fp32, against
    its loop-free form: 1.02× at 512 MiB, 0.98× at 32–128 MiB).
    """
    vec = 16 // itemsize
    threads = min(EW_THREADS, props.max_threads_per_block)
    if unrolled:
        grid = _cdiv(n, vec * threads * EW_UNROLL)
        if 2 * grid >= props.sm_count * max(1, props.max_threads_per_sm // threads):
            return Plan("elementwise", (min(grid, 2**31 - 1),), (threads,), 0, 0)
    return Plan("elementwise", (min(max(1, _cdiv(n, vec * threads)), 2**31 - 1),), (threads,), 0, 0)


def ew_unrolled(op: str) -> bool:
    """Whether ``op``'s forward (relu, gelu_erf, gelu_tanh, silu) takes :func:`elementwise_plan`'s
    unrolled trips: the erf GELU, the one kernel with the unrolled loop (elementwise.cu)."""
    return op == "gelu_erf"


@functools.lru_cache(maxsize=4096)
def row_plan(rows: int, cols: int, itemsize: int, arrays: int, props: DeviceProps) -> Plan:
    """The strategy and launch for ``rows`` rows of ``cols`` elements of ``itemsize`` bytes.

    ``arrays`` is how many row-sized inputs the kernel reads more than once (1 for a
    forward, 2 for a backward): the shared-memory cache of the long strategy holds them all.
    """
    vec = 16 // itemsize
    tpr = _pow2_at_least(_cdiv(max(cols, 1), ROW_CHUNKS * vec))
    if tpr <= _WARP:
        per_block = max(1, 128 // tpr)  # four warps a block
        # short of work: fewer rows a block, so that every SM gets blocks (at least a warp a block)
        while per_block > 1 and per_block * tpr > _WARP and _cdiv(rows, per_block) < 2 * props.sm_count:
            per_block //= 2
        return Plan("warp", (max(1, _cdiv(rows, per_block)),), (tpr, per_block), 0, 0)
    if tpr <= min(ROW_THREADS, props.max_threads_per_block):
        return Plan("block", (max(1, rows),), (tpr, 1), 0, 0)
    threads = min(LONG_THREADS, _pow2_at_least(props.max_threads_per_block + 1) // 2,
                  _pow2_at_least(_cdiv(cols, vec)))
    row_bytes = arrays * _cdiv(cols * itemsize, 16) * 16
    cache = row_bytes + _STATIC_SMEM <= props.smem_per_block_optin
    per_sm = max(1, props.max_threads_per_sm // threads)
    if cache:
        per_sm = max(1, min(per_sm, props.smem_per_sm // (row_bytes + _STATIC_SMEM)))
    grid = max(1, min(rows, per_sm * props.sm_count))
    return Plan("long", (grid,), (threads, 1), row_bytes if cache else 0, int(cache))


@functools.lru_cache(maxsize=4096)
def softmax_plan(rows: int, cols: int, itemsize: int, arrays: int, props: DeviceProps) -> Plan:
    """softmax's launch (``arrays`` 1: forward, 2: backward). The backward of 16-bit rows of ``C4_MIN_ROW_BYTES`` or
    more that are whole warps of ``WIDE_CHUNKS`` chunks a thread (bf16: multiples of 1,024 columns up to 32,768)
    takes "wide" at exactly those threads, on every device; every other row takes :func:`_softmax_rows`' plan, its
    register rows ("block", "wide" at 4 chunks) at exactly the threads whose chunks they fill where those are whole
    warps fewer than its power of two (:func:`_whole_warps`). H200, each kernel where the fwd + bwd step runs it (L2
    flushed; bench/diag_softmax_step.py, bench/results/ops-softmax-h200-2026-12-04/), us: bf16 backward 16384x5120
    147.6 -> 114.5 (Liger-Kernel 116.7), 4096x6144 43.1 -> 34.7 (37.4), 8192x3072 40.3 -> 34.3 (37.2), 8192x8192
    97.4 -> 93.0 (95.2), 4096x4096 24.6 -> 23.6 (25.1), 4096x12288 (clusters) 77.5 -> 70.9 (72.1), 2048x24576
    (clusters) 78.3 -> 73.2 (73.2); forward 16384x5120 110.5 -> 81.7 (104.7), 4096x6144 32.0 -> 26.6 (30.1),
    4096x12288 54.8 -> 51.0 (61.6); float forward 8192x3072 58.6 -> 49.9 (50.3). Float backwards ran within 2 %
    either way (block 4096: 183.2 at 2 chunks, 184.4 at 4) and keep theirs; the 16-bit forwards of 16,385-32,768
    columns keep their clusters (2048x24576: 74.0 against 79.1 "wide")."""
    t4 = _warps_of(cols, WIDE_CHUNKS, itemsize)
    if (arrays > 1 and itemsize == 2 and t4 and cols * itemsize >= C4_MIN_ROW_BYTES
            and t4 <= min(LONG_THREADS, props.max_threads_per_block)):
        return Plan("wide", (max(1, rows),), (t4, 1), 0, 0)
    return _whole_warps(_softmax_rows(rows, cols, itemsize, arrays, props), cols, itemsize)


def _warps_of(cols: int, chunks: int, itemsize: int) -> int:
    """The threads of a row of ``cols`` elements of ``itemsize`` bytes at exactly ``chunks`` 16-byte chunks each, where
    the row is that many chunks of whole warps; else 0."""
    t, rem = divmod(cols, chunks * (16 // itemsize))
    return t if not rem and t % _WARP == 0 else 0


def _threads_of(cols: int, chunks: int, itemsize: int) -> int:
    """The threads of a row of ``cols`` elements (whole 16-byte vectors) at ``chunks`` chunks each: exactly its whole
    warps where it is that (:func:`_warps_of`), else the power of two that covers it."""
    return _warps_of(cols, chunks, itemsize) or _pow2_at_least(_cdiv(cols // (16 // itemsize), chunks))


def _whole_warps(plan: Plan, cols: int, itemsize: int) -> Plan:
    """``plan`` where its register rows ("block" at ``ROW_CHUNKS`` chunks a thread, "wide" at ``WIDE_CHUNKS``, one row
    a block) of 2- or 4-byte types are whole warps of exactly those chunks fewer than its threads (a power of two): at
    those threads, so that each row fills its threads' chunks (the unchecked kernels) and no thread idles; else
    ``plan`` (double keeps the launches it was measured at)."""
    if plan.strategy not in ("block", "wide") or plan.chunks or plan.block[1] != 1 or itemsize not in (2, 4):
        return plan
    t = _warps_of(cols, ROW_CHUNKS if plan.strategy == "block" else WIDE_CHUNKS, itemsize)
    return plan._replace(block=(t, 1)) if t and t < plan.block[0] else plan


def _softmax_rows(rows: int, cols: int, itemsize: int, arrays: int, props: DeviceProps) -> Plan:
    """softmax's plan by its rows' strategy (before :func:`_whole_warps`): ``row_plan``'s, but rows too long for its
    register strategy and short enough for ``LONG_THREADS`` threads of ``WIDE_CHUNKS`` chunks (bf16 up to 32,768) take
    ``"wide"``: softmax_fwd_wide / softmax_bwd_wide, one block a row holding the row in registers, read once (the long
    strategy reads it, or its shared-memory copy, twice; the forward with an online rescale). On a device with clusters,
    16-bit rows take ``"cluster"`` (softmax_cluster.cu: 2 blocks of up to ``ROW_THREADS`` a row, persistent) instead:
    the backward where 2 chunks a thread hold them (bf16 up to 16,384), else 4; the forward only where 4 are needed
    (16,385-32,768). H200 against wide (bench/results/ops-cluster-h200-2026-11-26/diag-softmax*.json): forward +
    backward 1.19-1.41x as shipped; clusters' forwards 1.01-1.08x at 4 chunks but 0.79-0.92x at 2; fp32 0.62-0.80x, so
    fp32 keeps wide. The backward of rows that fill the wide kernel's chunks (no bounds checks: the power-of-two widths)
    takes "wide" on every device: once it stopped spilling, H200 (bench/diag_softmax_bwd.py), bf16 4096x16384 3,745 ->
    4,259 GB/s, 2048x32768 3,700 -> 4,145 (Liger 4,287, 4,206); 8192x12288 (checked chunks) ran 2,927 wide against the
    clusters' 4,067. The forward of 16-bit register rows ("block") of ``C4_MIN_ROW_BYTES`` or more in whole vectors
    takes "wide" too, at half the threads a row (4 chunks a thread): H200, kernels alone
    (bench/results/ops-fwd-c4-h200-2026-11-26/), bf16 2048x2048 3,350 -> 3,897 GB/s, 4096x4096 3,615 -> 3,739, 8192x8192
    3,857 -> 3,997; float rows ran as fast either way and keep "block". The forward takes a cluster of 4 where an SM
    holds 1.5x the threads of it (16,385-20,480 bf16 columns: 3 blocks of 160, not one of 288-320): H100
    (bench/results/ops-ln-late2-h100-2026-11-27/cluster_odd.txt) 1.08-1.20x; from 20,481 columns 0.66-0.95x. Float rows
    past that (16,385-32,768) take "wide" at WIDE8_CHUNKS (the backward where they fill them): H100 against long
    (bench/results/ops-softmax8-h100-2026-11-27/), 2048x32768 forward 1.33x (Liger's), backward 1.35x."""
    p = row_plan(rows, cols, itemsize, arrays, props)
    vec = 16 // itemsize
    tpr = _pow2_at_least(_cdiv(cols, WIDE_CHUNKS * vec))
    if (arrays == 1 and p.strategy == "block" and itemsize == 2 and cols % vec == 0
            and cols * itemsize >= C4_MIN_ROW_BYTES):
        return Plan("wide", (max(1, rows),), (tpr, 1), 0, 0)
    if p.strategy != "long":
        return p
    limit = min(ROW_THREADS, props.max_threads_per_block)
    wide = tpr <= min(LONG_THREADS, props.max_threads_per_block)
    if arrays > 1 and wide and cols == tpr * WIDE_CHUNKS * vec:
        return Plan("wide", (max(1, rows),), (tpr, 1), 0, 0)
    if props.clusters and itemsize == 2:  # softmax_cluster.cu: 2 blocks a row, of 2 chunks a thread or 4
        fits2 = _cdiv(cols, ROW_CHUNKS * vec) <= 2 * limit
        if fits2 and arrays > 1:
            return _cluster(rows, cols, itemsize, props, 2, ROW_CHUNKS, CLUSTER_FWD_BLOCKS, rows)
        if not fits2 and _cdiv(cols, WIDE_CHUNKS * vec) <= 2 * limit:
            two, four = (_cluster(rows, cols, itemsize, props, k, WIDE_CHUNKS, 1, rows) for k in (2, 4))
            held = [_cluster_per_sm(q.block[0], 1, props) * q.block[0] for q in (two, four)]  # threads an SM
            return four if arrays == 1 and 2 * held[1] >= 3 * held[0] else two
    t8 = _pow2_at_least(_cdiv(cols, WIDE8_CHUNKS * vec))  # float: 4096x20000's backward ran 0.97x at 8, keeps long
    if not wide and itemsize == 4 and t8 <= min(LONG_THREADS, props.max_threads_per_block) and \
            (arrays == 1 or cols == t8 * WIDE8_CHUNKS * vec):
        return Plan("wide", (max(1, rows),), (t8, 1), _staged(arrays, t8, props), 0, 1, WIDE8_CHUNKS)
    return Plan("wide", (max(1, rows),), (tpr, 1), 0, 0) if wide else p


def _staged(arrays: int, threads: int, props: DeviceProps) -> int:
    """The dynamic shared memory of softmax's 8-chunk float backward (``arrays`` 2) where the device holds it:
    ``softmax_bwd_wide_sm`` stages grad_y there (cp.async), and only y stays in registers; else 0 (the forward, or
    a device without the room: ``softmax_bwd_wide``, 100 bytes of spill stores on sm_90). The plan's ``shared_mem``
    picks the kernel. H100, the backward alone (bench/results/ops-softmax-staged-h100-2026-12-06/): 1.23-1.24x at
    1,024-8,192 rows of 32,768 (2048x32768 330.3 -> 267.3 us)."""
    smem = WIDE8_CHUNKS * threads * 16
    return smem if arrays > 1 and smem + _STATIC_SMEM <= min(props.smem_per_block_optin, props.smem_per_sm) else 0


def full_rows(plan: Plan, cols: int, itemsize: int, aligned: bool, chunks: int = ROW_CHUNKS) -> bool:
    """Whether ``plan``'s register rows ("warp", "block"; "wide" or norm_c4_plan's at ``chunks`` 4, up to
    ``C4_THREADS`` threads a row) take the kernel of the unchecked row alone (softmax_fwd_full, add_rms_norm_fwd_full;
    softmax_fwd_wide_full, layer_norm_fwd_c4_full, rms_norm_fwd_c4_full): each row fills its threads' chunks exactly
    and ``aligned`` (every pointer 16-byte aligned). Without the other row modes' code (the element path out of line,
    with a stack), H100, L2 flushed: softmax 0.07-0.16 us less a call (bench/diag_softmax_full.py: bf16 1x64 4.86 ->
    4.70 us, torch eager 4.74), add_rms_norm 1.006-1.032x the GB/s (bench/diag_add_rms_full.py: bf16 512x1024 623
    -> 643); at 4 chunks (bench/diag_full_rows.py) softmax 1.003-1.016x, rms_norm 1.00-1.04x, layer_norm
    1.00-1.02x."""
    if not aligned or plan.strategy not in ("warp", "block", "wide"):
        return False
    if chunks != ROW_CHUNKS and plan.block[0] > C4_THREADS:
        return False
    return cols == plan.block[0] * chunks * (16 // itemsize)


def softmax_fwd_kernel(plan: Plan, cols: int, itemsize: int, aligned: bool) -> tuple[str, str]:
    """(file, kernel) of softmax's forward of ``plan`` (``aligned``: x and y 16-byte aligned): the long and cluster
    kernels by strategy, :func:`softmax_fwd_wide3`'s, else softmax_fwd_wide / softmax_fwd, each ``_full`` where
    :func:`full_rows` (osm_ops.cpp's softmax_fwd_kernel is its twin; tests/ops/test_ops_native.py compares them)."""
    if plan.strategy == "long":
        return "softmax.cu", "softmax_fwd_long<{T}>"
    if plan.strategy == "cluster":
        return "softmax_cluster.cu", f"softmax_fwd_cluster<{plan.cluster}, {plan.chunks}, {{T}}>"
    wide3 = softmax_fwd_wide3(plan, cols, itemsize, aligned)
    if wide3:
        return "softmax.cu", wide3 + "<{T}>"
    wide = plan.strategy == "wide"
    name = "softmax_fwd_wide" if wide else "softmax_fwd"
    if full_rows(plan, cols, itemsize, aligned, WIDE_CHUNKS if wide else ROW_CHUNKS):
        return "softmax.cu", name + "_full<{T}>"  # the unchecked row alone
    # softmax_fwd_wide's chunks a thread: WIDE_CHUNKS, or the plan's (WIDE8_CHUNKS: float rows past WIDE_CHUNKS)
    return "softmax.cu", name + (f"<{{T}}, {plan.chunks or WIDE_CHUNKS}>" if wide else "<{T}>")


def softmax_fwd_wide3(plan: Plan, cols: int, itemsize: int, aligned: bool) -> str | None:
    """The kernel for softmax's forward of ``plan`` where it is ``"wide"`` with ``WIDE3_THREADS`` threads a row, of 2-
    or 4-byte types: ``"softmax_fwd_wide3_full"`` where the row fills the threads' chunks exactly and ``aligned`` (x and
    y 16-byte aligned), else ``"softmax_fwd_wide3"``; the same for the rows of fewer threads, more than ``C4_THREADS``
    (:func:`_whole_warps`' bf16 9,216-15,360 columns, float 4,608-7,680; H200, 4096x12288 51.0 us against
    softmax_fwd_wide's 64.7 at 384 threads); ``None`` otherwise (softmax_fwd_wide: 1,024 threads a row, 256 or fewer,
    double). Both run 3 blocks an SM at 40 registers with the exps computed twice. Measured on an H200
    (bench/results/ops-gated-h200-2026-11-26/, kernels alone, L2 flushed, softmax_fwd_wide → these): bf16 8192x12288
    3,165 -> 3,761 GB/s (Liger-Kernel 3,388), 4096x9000 2,417 -> 2,956, float 8192x6144 3,386 -> 4,095 (Liger 3,953)
    (wide3b.txt); bf16 4096x16384 3,442 -> 3,853 (Liger 3,669), 16384x16384 3,690 -> 4,109 (Liger 3,930) (w3full.txt,
    the full kernel's row)."""
    if (plan.strategy != "wide" or plan.chunks or itemsize not in (2, 4)
            or not C4_THREADS < plan.block[0] <= WIDE3_THREADS):
        return None
    full = aligned and cols == plan.block[0] * WIDE_CHUNKS * (16 // itemsize)
    return "softmax_fwd_wide3_full" if full else "softmax_fwd_wide3"


def _cluster(rows: int, cols: int, itemsize: int, props: DeviceProps, k: int, chunks: int, blocks: int,
             most: int) -> Plan:
    """A persistent cluster plan: ``k`` blocks a row of ``chunks`` chunks a thread, the row spread
    evenly over whole warps, as many clusters as the SMs hold (``blocks`` of ``ROW_THREADS`` an SM),
    at most ``most``."""
    tpr = _cdiv(_cdiv(cols, chunks * (16 // itemsize) * k), _WARP) * _WARP
    groups = max(1, min(_cluster_per_sm(tpr, blocks, props) * props.sm_count // k, most))
    return Plan("cluster", (groups * k,), (tpr, 1), 0, 0, k, chunks)


def _cluster_per_sm(tpr: int, blocks: int, props: DeviceProps) -> int:
    """The blocks of ``tpr`` threads an SM holds of a cluster plan (``blocks`` of ``ROW_THREADS``' registers)."""
    return max(1, min(ROW_THREADS * blocks, props.max_threads_per_sm) // tpr)
