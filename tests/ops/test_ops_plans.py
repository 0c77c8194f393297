"""opsmith.ops' launch plans on synthetic devices (tests/ops/devices.py), no GPU and no compiler:
every row covered within the device's limits, the strategy boundaries, the elementwise, weight-
gradient, softmax, layer_norm forward, cluster and norm-backward plans. test_ops_native.py checks
that the C++ plans are the same."""
from __future__ import annotations

import functools
import itertools

import pytest

from devices import A100, B200, H100, H200, PLAN_DEVICES, SMALL  # tests/ops/devices.py (pytest puts tests/ops on the path)
from opsmith.ops import _launch, _launch_bwd, _launch_norm, _sources
from opsmith.ops._launch import row_plan


@pytest.mark.parametrize("props", PLAN_DEVICES[0], ids=PLAN_DEVICES[1])
@pytest.mark.parametrize("itemsize", [2, 4, 8])
def test_row_plans_cover_every_row_within_the_device_limits(props, itemsize):
    vec = 16 // itemsize
    for arrays in (1, 2):
        for cols in (1, 2, 7, 31, 64, 100, 255, 256, 1000, 1024, 3000, 4096, 8192, 16384, 32768, 100_000):
            for rows in (1, 3, 65536):
                plan = row_plan(rows, cols, itemsize, arrays, props)
                threads = plan.block[0] * plan.block[1]
                assert 1 <= threads <= props.max_threads_per_block, plan
                assert plan.grid[0] >= 1
                if plan.strategy in ("warp", "block"):
                    tpr, per_block = plan.block
                    assert tpr & (tpr - 1) == 0  # a power of two: the shuffles' groups
                    assert tpr * _launch.ROW_CHUNKS * vec >= cols  # the row fits in registers
                    assert plan.grid[0] * per_block >= rows  # every row has its threads
                    assert (tpr <= 32) == (plan.strategy == "warp")
                    assert plan.strategy == "warp" or (per_block == 1 and tpr <= _launch.ROW_THREADS)
                    assert plan.shared_mem == 0
                else:
                    assert plan.strategy == "long" and plan.block[1] == 1
                    assert plan.block[0] % 32 == 0 and plan.block[0] <= _launch.LONG_THREADS
                    assert cols > _launch.ROW_THREADS * _launch.ROW_CHUNKS * vec // 2
                    assert plan.grid[0] <= rows
                    if plan.cache:
                        assert plan.shared_mem >= arrays * cols * itemsize
                        assert plan.shared_mem + 1024 <= props.smem_per_block_optin
                    else:
                        assert plan.shared_mem == 0
                        assert arrays * cols * itemsize + 1024 > props.smem_per_block_optin


def test_row_plan_strategy_boundaries_follow_the_device():
    # fp32: 8 floats a thread in registers; one warp holds 256, a 512-thread block 4096
    assert row_plan(1024, 256, 4, 1, H100).strategy == "warp"
    assert row_plan(1024, 257, 4, 1, H100).strategy == "block"
    assert row_plan(1024, 4096, 4, 1, H100).strategy == "block"
    assert row_plan(1024, 4097, 4, 1, H100).strategy == "long"
    # a long row is cached in shared memory where the opt-in limit allows, else read again
    assert row_plan(1024, 32768, 4, 1, H100).cache == 1
    assert row_plan(1024, 32768, 4, 2, H100).cache == 0  # 256 KiB for grad and y: too much
    assert row_plan(1024, 32768, 4, 1, A100).cache == 1
    assert row_plan(1024, 32768, 4, 1, SMALL).cache == 0
    # few rows: fewer rows a block so that more SMs get work
    few, many = row_plan(64, 64, 4, 1, H100), row_plan(65536, 64, 4, 1, H100)
    assert few.block[1] < many.block[1] and few.grid[0] * few.block[1] >= 64
    # grids come from the device: more SMs, more resident blocks
    assert row_plan(65536, 32768, 2, 1, H100).grid[0] > row_plan(65536, 32768, 2, 1, SMALL).grid[0]


def test_elementwise_and_weight_grad_plans():
    for props in (H100, A100, SMALL):
        assert _launch.elementwise_plan(1, 4, props).grid == (1,)
        # one vector a thread: 8 bf16 a vector, EW_THREADS threads a block
        assert _launch.elementwise_plan(1 << 28, 2, props).grid == ((1 << 28) // (8 * _launch.EW_THREADS),)
        assert _launch.elementwise_plan(1000, 4, props).grid == (1,)  # 1000 floats: 250 vectors, one block
        assert _launch.elementwise_plan(1000, 4, props, True).grid == (1,)  # too few for unrolled trips
        # unrolled: one trip a thread (EW_UNROLL vectors) from half a wave of blocks
        wave = props.sm_count * (props.max_threads_per_sm // _launch.EW_THREADS)
        per_block = 8 * _launch.EW_UNROLL * _launch.EW_THREADS
        for blocks in (wave // 2 - 1, wave // 2, wave // 2 + 1, 4 * wave):
            p = _launch.elementwise_plan(blocks * per_block, 2, props, True)
            assert p.grid[0] == (blocks if 2 * blocks >= wave else blocks * _launch.EW_UNROLL)
        # one vector a thread: the grid covers every vector (n // vec) at once
        for n, itemsize in itertools.product((1, 7, 8, 9, 1000, 2**20 + 3), (2, 4, 8)):
            p = _launch.elementwise_plan(n, itemsize, props)
            assert p.grid[0] * p.block[0] >= n // (16 // itemsize)
        assert [_launch.ew_unrolled(op) for op in ("relu", "gelu_erf", "gelu_tanh", "silu")] == \
            [False, True, False, False]
        for (rows, cols), itemsize in itertools.product(
                ((1, 1), (7, 33), (16, 4096), (17, 4096), (1024, 4096), (65536, 4096), (3, 100_000), (10**7, 64)),
                (2, 4, 8)):
            plan, per_chunk = _launch_bwd.weight_grad_plan(rows, cols, itemsize, props)
            col_blocks = -(-cols // (32 * (16 // itemsize)))
            if plan.strategy == "cluster":  # sm_90+: a cluster of chunks a column block, blocks enough for half the SMs
                assert props.clusters and rows > 16 and 2 * plan.grid[0] * col_blocks >= props.sm_count
                assert rows * cols * itemsize <= _launch.WEIGHT_CLUSTER_BYTES
                assert plan.grid == (_launch.WEIGHT_CLUSTER, col_blocks) and plan.cluster == _launch.WEIGHT_CLUSTER
                assert per_chunk == -(-rows // _launch.WEIGHT_CLUSTER)  # trailing chunks may be empty
                continue
            assert (not props.clusters or rows <= 16 or 2 * _launch.WEIGHT_CLUSTER * col_blocks < props.sm_count
                    or rows * cols * itemsize > _launch.WEIGHT_CLUSTER_BYTES)
            assert plan.grid[0] * 32 * (16 // itemsize) >= cols > (plan.grid[0] - 1) * 32 * (16 // itemsize)
            assert plan.grid[1] * per_chunk >= rows and plan.grid[1] <= 65535
            assert (plan.grid[1] - 1) * per_chunk < rows  # no empty chunk
            assert plan.grid[1] == 1 or rows > 16  # up to two rows a row lane: one chunk, no norm_col_sum
            assert per_chunk <= 8 * _launch.WEIGHT_LANE_ROWS or per_chunk == -(-rows // 65535)  # at most 8 rows a lane
    assert _launch.launch_config(_launch.elementwise_plan(1 << 20, 4, H100)) is \
        _launch.launch_config(_launch.elementwise_plan(1 << 20, 4, H100))  # one config per plan


@pytest.mark.parametrize("props", PLAN_DEVICES[0], ids=PLAN_DEVICES[1])
def test_softmax_plan_takes_clusters_or_the_wide_strategy_between_register_and_long_rows(props):
    """Rows beyond the register strategy: a backward's rows that fill the chunks of a "wide" block exactly
    (no bounds checks) "wide"; with clusters, 16-bit rows "cluster" where 2 blocks of ROW_THREADS hold
    them (2 chunks a thread backward, else WIDE_CHUNKS; the forward in 4 blocks where an SM holds 1.5x the threads
    of them), persistent; else "wide" where WIDE_CHUNKS chunks
    fit LONG_THREADS threads, one block a row; the forward of 16-bit "block" rows of C4_MIN_ROW_BYTES or more in
    whole vectors "wide" too (4 chunks a thread); float rows past that "wide" at WIDE8_CHUNKS (the forward, and the
    backward's rows that fill them); everything else as row_plan."""
    limit = min(_launch.ROW_THREADS, props.max_threads_per_block)
    for rows, cols, itemsize in itertools.product((1, 300, 65536), (100, 512, 1000, 1024, 3000, 4096, 8192, 8193, 16384,
                                                                     16385, 20480, 20481, 32768, 32769, 70000), (2, 4, 8)):
        for arrays in (1, 2):
            p, r = _launch._softmax_rows(rows, cols, itemsize, arrays, props), \
                _launch.row_plan(rows, cols, itemsize, arrays, props)
            vec = 16 // itemsize
            fits2 = -(-cols // (_launch.ROW_CHUNKS * vec)) <= 2 * limit
            fits4 = -(-cols // (_launch.WIDE_CHUNKS * vec)) <= 2 * limit
            tw = _launch._pow2_at_least(-(-cols // (_launch.WIDE_CHUNKS * vec)))
            full = tw * _launch.WIDE_CHUNKS * vec == cols and tw <= min(_launch.LONG_THREADS, props.max_threads_per_block)
            if r.strategy == "block" and arrays == 1 and itemsize == 2 and cols % vec == 0 and \
                    cols * itemsize >= _launch.C4_MIN_ROW_BYTES:
                assert p == _launch.Plan("wide", (rows,), (tw, 1), 0, 0), (rows, cols, itemsize)
                assert tw >= 32 and tw * _launch.WIDE_CHUNKS * vec >= cols > tw * _launch.WIDE_CHUNKS * vec // 2
                continue
            if r.strategy == "long" and arrays == 2 and full:
                assert p == _launch.Plan("wide", (rows,), (tw, 1), 0, 0), (rows, cols, itemsize)
                continue
            if props.clusters and itemsize == 2 and r.strategy == "long" and (fits2 and arrays == 2 or fits4 and not fits2):
                assert p.strategy == "cluster", (rows, cols, arrays)
            if p.strategy == "cluster":
                assert props.clusters and itemsize == 2 and r.strategy == "long" and p.shared_mem == 0
                tpr, chunks, k = p.block[0], p.chunks, p.cluster
                # 2 chunks a thread (the backward only), else 4
                assert chunks == (_launch.ROW_CHUNKS if fits2 and arrays == 2 else _launch.WIDE_CHUNKS)
                need = -(-cols // (chunks * vec))
                assert tpr % 32 == 0 and tpr <= limit and need <= k * tpr < need + 32 * k
                blocks = _launch.CLUSTER_FWD_BLOCKS if chunks == _launch.ROW_CHUNKS else 1
                resident = min(_launch.ROW_THREADS * blocks, props.max_threads_per_sm) // tpr * props.sm_count // k
                assert p.grid == (k * max(1, min(resident, rows)),)
                # a cluster of 4 (the forward at 4 chunks) where an SM holds 1.5x the threads it holds of 2
                held = {n: min(_launch.ROW_THREADS, props.max_threads_per_sm) // t * t
                        for n, t in ((n, -(-(-(-cols // (chunks * vec * n))) // 32) * 32) for n in (2, 4))}
                four = arrays == 1 and chunks == _launch.WIDE_CHUNKS and 2 * held[4] >= 3 * held[2]
                assert k == (4 if four else 2), (rows, cols, arrays, held)
                continue
            t8 = _launch._pow2_at_least(-(-cols // (_launch.WIDE8_CHUNKS * vec)))
            if itemsize == 4 and r.strategy == "long" and tw > min(_launch.LONG_THREADS, props.max_threads_per_block) \
                    and t8 <= min(_launch.LONG_THREADS, props.max_threads_per_block) \
                    and (arrays == 1 or cols == t8 * _launch.WIDE8_CHUNKS * vec):
                # float rows past WIDE_CHUNKS: twice the chunks (the backward's rows that fill them, grad_y staged in
                # shared memory where the device holds it: softmax_bwd_wide_sm)
                staged = _launch.WIDE8_CHUNKS * t8 * 16
                fits = staged + _launch._STATIC_SMEM <= min(props.smem_per_block_optin, props.smem_per_sm)
                smem = staged if arrays == 2 and fits else 0
                want = _launch.Plan("wide", (rows,), (t8, 1), smem, 0, 1, _launch.WIDE8_CHUNKS)
                assert p == want, (rows, cols, arrays)
                continue
            if p.strategy != "wide":
                assert p == r
                continue
            assert r.strategy == "long" and p.grid == (rows,) and p.shared_mem == 0 and p.chunks == 0
            tpr = p.block[0]
            assert p.block == (tpr, 1) and tpr <= min(_launch.LONG_THREADS, props.max_threads_per_block)
            assert tpr * _launch.WIDE_CHUNKS * vec >= cols > tpr * _launch.WIDE_CHUNKS * vec // 2  # the least that fits
    wide = "cluster" if props.clusters else "wide"
    assert _launch.softmax_plan(2048, 16384, 2, 1, props).strategy == "wide"  # bf16 16,384 forward: wide
    assert _launch.softmax_plan(2048, 16384, 2, 2, props).strategy == "wide"  # its backward: wide, every chunk full
    assert _launch.softmax_plan(2048, 12000, 2, 2, props).strategy == wide  # checked chunks: clusters
    assert _launch.softmax_plan(2048, 16384, 4, 2, props).strategy == "wide"  # fp32: wide
    assert _launch.softmax_plan(2048, 32768, 2, 1, props).strategy == wide  # bf16 32,768: 2 x 512 or 1,024 threads x 4
    assert _launch.softmax_plan(2048, 32768, 2, 2, props).strategy == "wide"  # the backward: wide (1,024 x 4, full)
    if props.max_threads_per_block >= 1024:  # fp32 32,768: 1,024 threads of 8 chunks, both ways; 20,000 forward only
        assert _launch.softmax_plan(2048, 32768, 4, 1, props).chunks == _launch.WIDE8_CHUNKS
        assert _launch.softmax_plan(2048, 32768, 4, 2, props).chunks == _launch.WIDE8_CHUNKS
        assert _launch.softmax_plan(2048, 20000, 4, 1, props).chunks == _launch.WIDE8_CHUNKS
        assert _launch.softmax_plan(2048, 20000, 4, 2, props).strategy == "long"
        # the backward stages grad_y (128 KiB) in shared memory where the device holds it; the forward never
        assert _launch.softmax_plan(2048, 32768, 4, 2, props).shared_mem == (131072 if props.smem_per_sm > 131072 + 1024
                                                                             else 0)
        assert _launch.softmax_plan(2048, 32768, 4, 1, props).shared_mem == 0
    assert _launch.softmax_plan(2048, 32769, 2, 1, props) == _launch.row_plan(2048, 32769, 2, 1, props)  # long
    k = 4 if props.clusters else 1  # 16,385-20,480 bf16 forwards: 3 blocks of 160 an SM in clusters of 4, not 1 of 320
    for cols, arrays, want in ((16385, 1, k), (20480, 1, k), (20500, 2, k // 2 or 1), (20481, 1, k // 2 or 1)):
        assert _launch.softmax_plan(2048, cols, 2, arrays, props).cluster == want, (cols, arrays)
    assert _launch.softmax_plan(2048, 32769, 2, 2, props) == _launch.row_plan(2048, 32769, 2, 2, props)
    assert _launch.softmax_plan(2048, 8192, 2, 1, props) == _launch.Plan("wide", (2048,), (256, 1), 0, 0)  # 4 chunks
    assert _launch.softmax_plan(2048, 1024, 2, 1, props) == _launch.Plan("wide", (2048,), (32, 1), 0, 0)  # a warp
    assert _launch.softmax_plan(2048, 8000, 2, 2, props).strategy == "block"  # the backward of partial warps: 2 chunks
    assert _launch.softmax_plan(2048, 4096, 4, 1, props).strategy == "block"  # and so do float rows
    assert _launch.softmax_plan(2048, 1000, 2, 1, props).strategy == "block"  # and partial vectors


@pytest.mark.parametrize("props", PLAN_DEVICES[0], ids=PLAN_DEVICES[1])
def test_layer_norm_forward_kernel_choice(props):
    """layer_norm_fwd_wide for block rows of LN_WIDE_TPR threads or more with 16-byte access only;
    layer_norm_fwd for warp rows, narrower block rows and element access; the long kernel for long rows."""
    for rows, cols, itemsize in itertools.product((1, 300, 65536), (1, 100, 1024, 2048, 3000, 4096, 8192, 20000),
                                                  (2, 4, 8)):
        p = _launch.row_plan(rows, cols, itemsize, 1, props)
        for vec in (True, False):
            k = _launch_norm.layer_norm_kernel(p, vec)
            if p.strategy == "long":
                assert k == "layer_norm_fwd_long"
            elif vec and p.strategy == "block" and p.block[0] >= _launch.LN_WIDE_TPR:
                assert k == "layer_norm_fwd_wide"
            else:
                assert k == "layer_norm_fwd", (rows, cols, itemsize, vec, p)
    p = _launch.row_plan(4096, 4096, 2, 1, props)
    assert _launch_norm.layer_norm_kernel(p, True) == "layer_norm_fwd_wide"  # bf16 4096-wide rows: 256 threads
    assert _launch_norm.layer_norm_kernel(_launch.row_plan(65536, 1024, 2, 1, props), True) == "layer_norm_fwd"


@pytest.mark.parametrize("props", PLAN_DEVICES[0], ids=PLAN_DEVICES[1])
def test_norm_cluster_plan_covers_rows_between_one_block_and_eight(props):
    """norm_cluster_plan: only on devices with clusters, only for rows row_plan sends to "long": 2
    blocks of up to ROW_THREADS both ways, for rows twice as long 2 blocks of 4 chunks a thread
    forward (16-bit types) and 8 of up to CLUSTER_THREADS backward, the row spread
    evenly over whole warps; both directions run the clusters the SMs hold at once (fewer where the
    rows are fewer: a row a cluster forward, two backward); longer rows stay long."""
    limit = min(_launch.ROW_THREADS, props.max_threads_per_block)
    for rows, cols, itemsize in itertools.product((1, 7, 300, 4099, 65536), (1000, 4096, 8192, 8200, 12000, 16384,
                                                                            16392, 32768, 32776, 65536, 262144),
                                                  (2, 4, 8)):
        vec = 16 // itemsize
        units = -(-cols // (_launch.ROW_CHUNKS * vec))
        for backward in (False, True):
            plan = _launch_norm.norm_cluster_plan(rows, cols, itemsize, props, backward)
            longest = _launch.CLUSTER_MAX * _launch.CLUSTER_THREADS if backward else \
                2 * limit * (_launch.WIDE_CHUNKS // _launch.ROW_CHUNKS if itemsize == 2 else 1)
            if not props.clusters or units <= limit or units > longest:
                assert plan is None, (rows, cols, itemsize, backward)
                continue
            assert _launch.row_plan(rows, cols, itemsize, 1, props).strategy == "long"
            k, (tpr, one), chunks = plan.cluster, plan.block, plan.chunks
            assert one == 1 and plan.shared_mem == 0
            if units <= 2 * limit:  # 2 blocks of 2 chunks a thread
                assert (k, chunks) == (2, _launch.ROW_CHUNKS)
            else:  # longer: 2 blocks of 4 chunks forward, 8 of 2 backward
                assert (k, chunks) == ((_launch.CLUSTER_MAX, 2) if backward else (2, _launch.WIDE_CHUNKS))
            assert tpr % 32 == 0 and tpr <= (limit if k == 2 else _launch.CLUSTER_THREADS)
            need = -(-cols // (chunks * vec))  # threads the row needs
            assert need <= k * tpr < need + 32 * k  # the row fits, spread evenly (whole warps a block)
            assert plan.grid[0] % k == 0
            blocks = _launch.ROW_BWD_BLOCKS if backward else _launch.CLUSTER_FWD_BLOCKS if chunks == 2 else 1
            most = -(-rows // 2) if backward else rows
            groups = plan.grid[0] // k
            resident = min(_launch.ROW_THREADS * blocks, props.max_threads_per_sm) // tpr * props.sm_count // k
            assert 1 <= groups <= max(1, resident) and groups <= max(1, most)
            if most >= resident:  # enough rows: every SM full
                assert groups == max(1, resident)


@pytest.mark.parametrize("props", PLAN_DEVICES[0], ids=PLAN_DEVICES[1])
def test_norm_backward_plan_is_persistent_and_its_partials_stay_small(props):
    """norm_bwd_plan on synthetic devices: few rows a block run "split" (grad_x a row a row lane,
    where the partial sums' bytes would outweigh a second read of the input; half the bytes for
    rms_norm's one array). Else register rows get a persistent grid of at most the blocks
    an SM holds at once (ROW_THREADS * ROW_BWD_BLOCKS threads: the kernels take up to 128 registers
    a thread), blocks within the kernel's limit, every row covered by the grid-stride loop, and
    partial sums (a row a block) small beside the input once the input is large; blocks of several
    rows within norm_bwd.cuh's OPSMITH_BWD_BLOCK (write_partial's shared buffer; it traps beyond)."""
    import re
    source = (_sources.KERNEL_DIR / "norm_bwd.cuh").read_text()
    assert int(re.search(r"#define OPSMITH_BWD_BLOCK (\d+)", source).group(1)) == _launch.NORM_BWD_BLOCK
    split = (_sources.KERNEL_DIR / "norm_split.cu").read_text()
    assert int(re.search(r"#define OPSMITH_WEIGHT_CLUSTER (\d+)", split).group(1)) == _launch.WEIGHT_CLUSTER
    for rows, cols, itemsize in itertools.product((1, 7, 300, 4099, 65536, 10**6),
                                                  (1, 33, 1000, 1536, 3072, 4096, 5120, 8192, 20000), (2, 4, 8)):
        p = _launch_bwd.norm_bwd_plan(rows, cols, itemsize, props)
        if p.strategy == "long":  # too long for registers: row_plan's long plan, norm_bwd_weight after
            assert p == _launch.row_plan(rows, cols, itemsize, 2, props)
            continue
        assert p.strategy in ("persistent", "split")
        tpr, per_block = p.block
        if tpr & (tpr - 1):  # not a power of two: a row of 2- or 4-byte types, exactly whole warps of its chunks;
            assert itemsize in (2, 4) and tpr % 32 == 0 and tpr * _launch.ROW_CHUNKS * (16 // itemsize) == cols
            tpr = 1 << (tpr - 1).bit_length()  # rows a block and the grid are those of the power of two
        resident = min(_launch.ROW_THREADS * _launch.ROW_BWD_BLOCKS, props.max_threads_per_sm)
        full = max(1, resident // (tpr * per_block)) * props.sm_count  # the persistent grid with rows enough
        split_bytes = _launch.NORM_SPLIT_BYTES * max(1, min(full, -(-rows // (2 * per_block))))  # x arrays
        if p.strategy == "split":  # few rows a block: grad_x a row a row lane, every row at once
            assert p.grid[0] == -(-rows // per_block) > props.sm_count or per_block == 1
            few = -(-rows // per_block) <= props.sm_count  # a row a block fits the SMs
            assert few or rows * itemsize < 2 * split_bytes
            rms = _launch_bwd.norm_bwd_plan(rows, cols, itemsize, props, 1)  # one array of partials: half the bytes
            assert rms.strategy == ("split" if few or rows * itemsize < split_bytes else "persistent")
            continue
        assert rows * itemsize >= 2 * split_bytes and -(-rows // per_block) > props.sm_count or per_block > 1
        assert tpr * per_block <= min(_launch.ROW_THREADS, props.max_threads_per_block)
        assert per_block == 1 or tpr * per_block <= _launch.NORM_BWD_BLOCK  # write_partial's shared buffer
        assert tpr * _launch.ROW_CHUNKS * (16 // itemsize) >= cols  # a row fits a row lane's registers
        assert 1 <= p.grid[0] <= max(1, resident // (tpr * per_block)) * props.sm_count
        if rows >= 2 * per_block * props.sm_count * (resident // (tpr * per_block)):  # enough rows: every SM full
            assert p.grid[0] == max(1, resident // (tpr * per_block)) * props.sm_count
        if per_block > 1 and -(-rows // per_block) <= props.sm_count:  # few narrow rows: a row a row lane
            assert p.grid[0] == max(1, -(-rows // per_block))
        else:
            assert p.grid[0] * per_block * 2 <= rows + 2 * per_block  # at least about two rows a row lane
        if rows * cols * itemsize >= 64 << 20:  # partial sums (float) at most 1/4 of one input
            assert p.grid[0] * cols * 4 * 4 <= rows * cols * itemsize


@pytest.mark.parametrize("props", PLAN_DEVICES[0], ids=PLAN_DEVICES[1])
def test_norm_bwd_c4_plan_takes_the_float_rows_past_the_2_chunk_kernels(props):
    """norm_bwd_c4_plan on synthetic devices: float rows in whole vectors too long for the 2-chunk register rows and
    short enough for 4 chunks a thread (4,097-8,192 columns; layer_norm's past BWD_C4_LN_MIN_ROW_BYTES) get a block a
    row of at most ROW_THREADS, one block an SM, at most one block for two rows, and the shared memory the kernel
    indexes at a stride of ROW_THREADS (the sums in float, the weight as loaded); other rows, other types and odd
    widths get None, and so does a device whose blocks cannot have that shared memory."""
    import re
    source = (_sources.KERNEL_DIR / "norm.cu").read_text()
    assert "rms_norm_bwd_rows<T, A, 4>" in source and "layer_norm_bwd_rows<T, A, false, 4>" in source
    assert re.search(r"__launch_bounds__\(OPSMITH_ROW_THREADS, 1\)\nrms_norm_bwd_c4", source)
    for rows, cols, itemsize, arrays in itertools.product((1, 2, 3, 300, 10**6), (4096, 4097, 4100, 5120, 5124, 6144,
                                                                                 8190, 8192, 8196, 16384),
                                                          (2, 4, 8), (1, 2)):
        p = _launch_bwd.norm_bwd_c4_plan(rows, cols, itemsize, props, arrays)
        smem = (arrays * 4 * 4 + 16) * _launch.BWD_C4_CHUNKS * _launch.ROW_THREADS
        fits = smem <= min(props.smem_per_block_optin, props.smem_per_sm)
        want = itemsize == 4 and cols % 4 == 0 and 4096 < cols <= 8192 and fits and \
            (arrays == 1 or cols * 4 > _launch.BWD_C4_LN_MIN_ROW_BYTES)
        assert (p is not None) == want, (rows, cols, itemsize, arrays)
        if p is None:
            continue
        assert p.strategy == "c4" and p.block == (512, 1) and p.shared_mem == smem
        assert p.block[0] * _launch.BWD_C4_CHUNKS * 4 >= cols > p.block[0] * _launch.ROW_CHUNKS * 4
        assert p.grid == (max(1, min(props.sm_count, -(-rows // 2))),)
        assert _launch_bwd.norm_bwd_plan(rows, cols, itemsize, props, arrays).strategy == "long"  # what it replaces


@pytest.mark.parametrize("props", PLAN_DEVICES[0], ids=PLAN_DEVICES[1])
def test_norm_bwd_sm_plan_takes_the_persistent_rows_of_288_to_320_threads_at_two_blocks_an_sm(props):
    """norm_bwd_sm_plan on synthetic devices: norm_bwd_plan's persistent rows of a row a block at more than ROW_THREADS
    / 2 and at most BWD_SM_THREADS threads (2- and 4-byte types in whole vectors: bf16 4,608 and 5,120 columns, float
    2,304 and 2,560; not 16-bit layer_norm, which ran slower) get the same block at twice the SMs' blocks (at most
    one for two rows) and the shared memory the kernels index at a stride of ROW_THREADS (the sums in float, the
    weight as loaded), where two blocks of it fit an SM; everything else None. The kernels' launch bounds hold two
    blocks of BWD_SM_THREADS."""
    import re
    source = (_sources.KERNEL_DIR / "norm.cu").read_text()
    for k in ("layer_norm_bwd_sm", "layer_norm_bwd_sm_res", "rms_norm_bwd_sm"):
        assert re.search(r"__launch_bounds__\(OPSMITH_BWD_SM_THREADS, 2\)\n" + k + r"\(", source), k
    head = (_sources.KERNEL_DIR / "norm_bwd.cuh").read_text()
    assert f"#define OPSMITH_BWD_SM_THREADS {_launch.BWD_SM_THREADS}\n" in head
    seen = set()
    for rows, cols, itemsize, arrays in itertools.product((1, 200, 300, 2000, 10**6),
                                                          (2048, 2304, 2306, 2560, 3072, 4096, 4352, 4608, 5120, 5122,
                                                           6144), (2, 4, 8), (1, 2)):
        p = _launch_bwd.norm_bwd_sm_plan(rows, cols, itemsize, props, arrays)
        base = _launch_bwd.norm_bwd_plan(rows, cols, itemsize, props, arrays)
        smem = (arrays * (16 // itemsize) * 4 + 16) * _launch.ROW_CHUNKS * _launch.ROW_THREADS
        fits = 2 * (smem + _launch._STATIC_SMEM) <= props.smem_per_sm and smem <= props.smem_per_block_optin
        want = itemsize in (2, 4) and cols % (16 // itemsize) == 0 and base.strategy == "persistent" and \
            not (itemsize == 2 and arrays == 2) and \
            base.block[1] == 1 and _launch.ROW_THREADS // 2 < base.block[0] <= _launch.BWD_SM_THREADS and fits
        assert (p is not None) == want, (rows, cols, itemsize, arrays)
        if p is None:
            continue
        seen.add((cols, itemsize))
        assert p.strategy == "sm" and p.block == base.block and p.shared_mem == smem
        assert p.block[0] * _launch.ROW_CHUNKS * (16 // itemsize) == cols  # whole warps that the row fills
        assert p.grid == (max(1, min(2 * props.sm_count, -(-rows // 2))),)
    if props.smem_per_sm >= 2 * (160 << 10) + 4096:  # layer_norm's two blocks of 2-byte rows fit
        assert seen == {(4608, 2), (5120, 2), (2304, 4), (2560, 4)}


@pytest.mark.parametrize("props", PLAN_DEVICES[0], ids=PLAN_DEVICES[1])
def test_norm_c8_plan_takes_rows_past_16_kib_up_to_32_kib_in_whole_vectors(props):
    """norm_c8_plan: rows of more than L2_MIN_ROW_BYTES up to C8_MAX_ROW_BYTES in whole 16-byte vectors of 2- and
    4-byte types, a block a row of 8 chunks a thread within norm.cu's OPSMITH_C4_THREADS (its launch bounds);
    the row fits the block's registers; on devices of at most LOW_BW_SM_GBPS of DRAM bandwidth an SM only (the H100
    and A100: the H200's L2 rows ran faster, and a device whose bandwidth is not known keeps them). Everything
    else: None."""
    low = props in (H100, A100)
    assert _launch_norm.low_bandwidth_per_sm(props) == low
    for rows, cols, itemsize in itertools.product((1, 300, 65536), (4096, 8192, 8196, 12000, 12288, 16384, 16392,
                                                                    32768), (2, 4, 8)):
        p = _launch_norm.norm_c8_plan(rows, cols, itemsize, props)
        vec = 16 // itemsize
        if itemsize == 8 or cols % vec or not _launch.L2_MIN_ROW_BYTES < cols * itemsize <= _launch.C8_MAX_ROW_BYTES \
                or not low:
            assert p is None, (rows, cols, itemsize)
            continue
        tpr = p.block[0]
        assert p.strategy == "block" and p.grid == (rows,) and p.block == (tpr, 1)
        assert tpr <= _launch.C4_THREADS and (tpr // 2) * 8 * vec < cols <= tpr * 8 * vec
        assert tpr & (tpr - 1) == 0 or tpr * 8 * vec == cols and tpr % 32 == 0  # or exactly whole warps (12,288)
    source = (_sources.KERNEL_DIR / "norm.cu").read_text()
    assert f"#define OPSMITH_C4_THREADS {_launch.C4_THREADS}" in source
    assert "layer_norm_fwd_c8<{T}, {A}>" in _sources.FILES["norm.cu"]


@pytest.mark.parametrize("props", PLAN_DEVICES[0], ids=PLAN_DEVICES[1])
def test_add_rms_c8_plan_takes_rows_past_16_kib_up_to_64_kib_in_whole_vectors(props):
    """add_rms_c8_plan: add_rms_norm's rows of more than L2_MIN_ROW_BYTES up to C8_FUSED_MAX_ROW_BYTES in whole
    16-byte vectors of 2- and 4-byte types, a block a row of 8 chunks a thread: add_rms_norm_fwd_c8 up to
    OPSMITH_C8_THREADS (C4_THREADS), add_rms_norm_fwd_c8k up to OPSMITH_C8K_THREADS (their launch bounds).
    Everything else: None."""
    seen = set()
    for rows, cols, itemsize in itertools.product((1, 300, 65536), (4096, 8192, 8196, 12000, 16384, 16392, 24000,
                                                                    32768, 32776, 65536), (2, 4, 8)):
        p = _launch_norm.add_rms_c8_plan(rows, cols, itemsize, props)
        vec = 16 // itemsize
        if itemsize == 8 or cols % vec or not (_launch.L2_MIN_ROW_BYTES < cols * itemsize
                                               <= _launch.C8_FUSED_MAX_ROW_BYTES):
            assert p is None, (rows, cols, itemsize)
            continue
        tpr = p.block[0]
        assert p.strategy == "block" and p.grid == (rows,) and p.block == (tpr, 1)
        assert tpr & (tpr - 1) == 0 and tpr <= _launch.C8K_THREADS and (tpr // 2) * 8 * vec < cols <= tpr * 8 * vec
        kernel = _launch_norm.add_rms_c8_kernel(p)
        assert kernel == ("add_rms_norm_fwd_c8" if tpr <= _launch.C4_THREADS else "add_rms_norm_fwd_c8k")
        seen.add(kernel)
    assert seen == {"add_rms_norm_fwd_c8", "add_rms_norm_fwd_c8k"}
    source = (_sources.KERNEL_DIR / "fused_norm.cu").read_text()
    assert f"#define OPSMITH_C8_THREADS {_launch.C4_THREADS}" in source
    assert f"#define OPSMITH_C8K_THREADS {_launch.C8K_THREADS}" in source
    assert {"add_rms_norm_fwd_c8<{T}, {A}>", "add_rms_norm_fwd_c8k<{T}, {A}>"} <= set(_sources.FILES["fused_norm.cu"])


@pytest.mark.parametrize("props", PLAN_DEVICES[0], ids=PLAN_DEVICES[1])
def test_norm_backward_of_few_rows_is_one_launch_of_grad_x_blocks_then_weight_blocks(props):
    """norm_bwd_small_plan: 1 to SMALL_BWD_ROWS rows whose row lane fits NORM_BWD_BLOCK threads (norm_small.cu's
    OPSMITH_SMALL_THREADS; its kernels trap on other blocks) take one launch: ceil(rows / rows a block) blocks of
    grad_x rows, then weight blocks of ``chunks`` column lanes covering every column once, each row lane at most
    WEIGHT_LANE_ROWS rows unless the lanes are at their floor, 8 to 256 columns a block (a column adds up within a
    warp). Anything else: None (norm_bwd_plan's plans)."""
    import re
    source = (_sources.KERNEL_DIR / "norm_small.cu").read_text()
    assert int(re.search(r"#define OPSMITH_SMALL_THREADS (\d+)", source).group(1)) == _launch.NORM_BWD_BLOCK
    block = _launch.NORM_BWD_BLOCK
    for rows, cols, itemsize in itertools.product((1, 2, 3, 64, 255, 1000, 1024, 1025, 10**6),
                                                  (1, 8, 33, 100, 1000, 1024, 2048, 4096, 4097, 8192), (2, 4, 8)):
        p = _launch_bwd.norm_bwd_small_plan(rows, cols, itemsize, props)
        vec = 16 // itemsize
        tpr = _launch._pow2_at_least(-(-cols // (_launch.ROW_CHUNKS * vec)))
        if not 1 <= rows <= _launch.SMALL_BWD_ROWS or tpr > block:
            assert p is None, (rows, cols, itemsize)
            continue
        assert p.strategy == "small" and p.block == (tpr, block // tpr), (rows, cols, itemsize, p)
        lanes, width = p.chunks, p.chunks * vec
        assert 8 <= width <= block and block % width == 0 and block // width <= 32
        col_blocks = p.grid[0] - -(-rows // (block // tpr))
        assert (col_blocks - 1) * width < cols <= col_blocks * width
        floor = max(_launch.SMALL_MIN_LANES, -(-8 // vec))
        assert -(-rows // (block // lanes)) <= _launch.WEIGHT_LANE_ROWS or lanes <= floor, (rows, cols, p)
        assert lanes <= 32 and (lanes <= _launch._pow2_at_least(-(-cols // vec)) or lanes == -(-8 // vec))


@pytest.mark.parametrize("props", PLAN_DEVICES[0], ids=PLAN_DEVICES[1])
def test_layer_norm_fwd4_plan_takes_float_rows_between_one_block_and_two_in_whole_vectors(props):
    """layer_norm_fwd4: float rows past the register strategy (4,096) that fit a block of 4 chunks a
    thread (8,192), in whole 16-byte vectors; everything else keeps its plan (None)."""
    limit = min(_launch.ROW_THREADS, props.max_threads_per_block)
    for rows, cols, itemsize in itertools.product((1, 300, 65536), (100, 4096, 4097, 4100, 6000, 8192, 8196, 16384),
                                                  (2, 4, 8)):
        p = _launch_norm.layer_norm_fwd4_plan(rows, cols, itemsize, props)
        if itemsize != 4 or cols % 4 or not 4 * 2 * limit < cols <= 4 * _launch.LN_FWD4_CHUNKS * limit:
            assert p is None, (rows, cols, itemsize)
            continue
        tpr = p.block[0]
        assert p.strategy == "block" and p.grid == (rows,) and p.block == (tpr, 1)
        assert tpr <= limit and tpr & (tpr - 1) == 0 and (tpr // 2) * _launch.LN_FWD4_CHUNKS * 4 < cols <= tpr * 16
    source = (_sources.KERNEL_DIR / "norm.cu").read_text()
    assert "layer_norm_fwd_any<0, T, A, 4>" in source and _launch.LN_FWD4_CHUNKS == 4


@pytest.mark.parametrize("props", PLAN_DEVICES[0], ids=PLAN_DEVICES[1])
def test_norm_c4_plan_takes_rows_of_2_to_16_kib_in_whole_vectors_at_four_chunks_a_thread(props):
    """norm.cu's *_fwd_c4: rows of C4_MIN_ROW_BYTES up to L2_MIN_ROW_BYTES, and rows of exactly that (the
    callers try it before norm_l2_plan): layer_norm's on every device, rms_norm's on devices of at most
    LOW_BW_SM_GBPS of DRAM bandwidth an SM (the H100 and A100, not the H200 or a device whose bandwidth is not
    known), in whole 16-byte vectors, of 2-byte types (layer_norm, arrays 2: float too), one block a row of the
    least power of two threads that holds 4 chunks each, at most C4_THREADS, or exactly the threads of a row that is
    whole warps of 4 chunks; everything else keeps its plan (None)."""
    for rows, cols, itemsize, arrays in itertools.product(
            (1, 300, 65536), (100, 512, 1000, 1024, 1028, 1536, 2048, 2560, 3000, 3072, 3584, 4096, 5120, 6000, 6144,
                              7168, 8192, 8200, 16384), (2, 4, 8), (1, 2)):
        p = _launch_norm.norm_c4_plan(rows, cols, itemsize, props, arrays)
        vec = 16 // itemsize
        types = (2, 4) if arrays == 2 else (2,)
        top = 16384 if props in (H100, A100) or arrays == 2 else 16383  # layer_norm's: every device
        if itemsize not in types or cols % vec or not 2048 <= cols * itemsize <= top:
            assert p is None, (rows, cols, itemsize, arrays)
            continue
        tpr = p.block[0]
        assert p == _launch.Plan("block", (rows,), (tpr, 1), 0, 0)
        assert 32 <= tpr <= _launch.C4_THREADS and tpr * 4 >= cols // vec > tpr * 2
        whole = cols // vec % 4 == 0 and cols // vec // 4 % 32 == 0  # whole warps of 4 chunks: exactly their threads
        assert tpr == (cols // vec // 4 if whole else 1 << (-(-cols // vec // 4) - 1).bit_length()), (cols, tpr)
        assert _launch.full_rows(p, cols, itemsize, True, 4) == whole  # the unchecked kernels: every chunk filled
    assert (_launch.C4_MIN_ROW_BYTES, _launch.L2_MIN_ROW_BYTES, _launch.LOW_BW_SM_GBPS) == (2048, 16384, 30)
    assert _launch_norm.norm_c4_plan(9, 1024, 2, props, 1).block == (32, 1)  # bf16 1,024: a warp a row
    assert _launch_norm.norm_c4_plan(9, 5120, 2, props, 2).block == (160, 1)  # bf16 5,120: 160 threads, not 256
    assert _launch_norm.norm_c4_plan(9, 6000, 2, props, 2).block == (256, 1)  # not whole warps: the power of two
    assert _launch_norm.norm_c4_plan(9, 3072, 4, props, 2).block == (192, 1)  # float layer_norm 3,072
    source = (_sources.KERNEL_DIR / "norm.cu").read_text()
    assert f"#define OPSMITH_C4_THREADS {_launch.C4_THREADS}" in source


@pytest.mark.parametrize("props", PLAN_DEVICES[0], ids=PLAN_DEVICES[1])
def test_norm_forward_plans_take_rows_of_whole_warps_at_their_threads(props):
    """norm_fwd_plan's register rows (2 chunks a thread: float rms_norm, add_rms_norm) and the rows of 8 chunks
    (norm_c8_plan, add_rms_c8_plan): a row of a 2- or 4-byte type that is whole warps of those chunks, fewer than the
    power of two, takes exactly those threads (each row fills its threads' chunks: the unchecked kernels), any other
    row the power of two; double, the clusters and the long rows keep their plans."""
    for rows, cols, itemsize in itertools.product(
            (1, 300, 65536), (256, 768, 1000, 1536, 3072, 3584, 4096, 5120, 6144, 7680, 10240, 12288, 14336, 16384,
                              20480, 24576, 32768, 40000), (2, 4, 8)):
        vec = 16 // itemsize
        p, q = _launch_norm.norm_fwd_plan(rows, cols, itemsize, props), row_plan(rows, cols, itemsize, 1, props)
        if q.strategy == "long":
            cluster = _launch_norm.norm_cluster_plan(rows, cols, itemsize, props, False)
            assert p == (cluster or q), (rows, cols, itemsize)
        else:
            t, rem = divmod(cols, _launch.ROW_CHUNKS * vec)
            whole = itemsize != 8 and q.strategy == "block" and not rem and t % 32 == 0 and t < q.block[0]
            assert p == (q._replace(block=(t, 1)) if whole else q), (rows, cols, itemsize)
            assert not whole or _launch.full_rows(p, cols, itemsize, True)
        for c8 in (_launch_norm.norm_c8_plan(rows, cols, itemsize, props),
                   _launch_norm.add_rms_c8_plan(rows, cols, itemsize, props)):
            if c8 is None:
                continue
            t, rem = divmod(cols, 8 * vec)
            assert c8.block[0] == (t if not rem and t % 32 == 0 else 1 << (-(-cols // (8 * vec)) - 1).bit_length())
    assert _launch_norm.norm_fwd_plan(8, 3072, 4, props).block == (384, 1)  # float 3,072: 384 threads, not 512
    assert _launch_norm.norm_fwd_plan(8, 1536, 8, props).block == (512, 1)  # double 1,536 (384 threads): its own
    assert _launch_norm.add_rms_c8_plan(8, 12288, 2, props).block == (192, 1)  # bf16 12,288: 192, not 256
    assert _launch_norm.add_rms_c8_plan(8, 12000, 2, props).block == (256, 1)  # not whole warps: the power of two


@pytest.mark.parametrize("props", PLAN_DEVICES[0], ids=PLAN_DEVICES[1])
def test_layer_norm_full2_plan_takes_16_bit_rows_of_2_to_4_kib_that_fill_two_chunks(props):
    """norm.cu's layer_norm_fwd_full: 16-bit rows of C4_MIN_ROW_BYTES to LN_FULL2_MAX_ROW_BYTES whose width fills
    row_plan's threads at ROW_CHUNKS chunks each (bf16 1,024 and 2,048: 64 and 128 threads a row) take row_plan's
    plan, on devices of low DRAM bandwidth an SM (H100, A100) at any row count, on the others (the H200, the small
    device) up to LN_FULL2_HIGH_BW_ROWS rows; every other row (checked widths, float, 512 or 4,096 bf16 columns)
    keeps norm_c4_plan's (None here)."""
    for rows, cols, itemsize in itertools.product((1, 300, 4096, 4097, 65536), (512, 1000, 1024, 1032, 1536, 2048,
                                                                                2056, 3000, 4096), (2, 4, 8)):
        p = _launch_norm.layer_norm_full2_plan(rows, cols, itemsize, props)
        tpr = cols // 16
        few = props in (H100, A100) or rows <= _launch.LN_FULL2_HIGH_BW_ROWS
        if itemsize != 2 or cols not in (1024, 2048) or not few:  # 1,536: 96 threads, not a power of two
            assert p is None, (rows, cols, itemsize)
            continue
        assert p == _launch.row_plan(rows, cols, itemsize, 1, props) == _launch.Plan("block", (rows,), (tpr, 1), 0, 0)
        assert _launch.full_rows(p, cols, itemsize, True) and not _launch.full_rows(p, cols, itemsize, True, 4)
    assert (_launch.LN_FULL2_MAX_ROW_BYTES, _launch.ROW_CHUNKS, _launch.LN_FULL2_HIGH_BW_ROWS) == (4096, 2, 4096)
    source = (_sources.KERNEL_DIR / "norm.cu").read_text()
    assert "layer_norm_fwd_row<ROW_FULL, 0, T, A>(x, w, b, y" in source  # layer_norm_fwd_full: 2 chunks (the default)


@pytest.mark.parametrize("props", PLAN_DEVICES[0], ids=PLAN_DEVICES[1])
def test_norm_l2_plan_takes_rows_of_16_kib_in_whole_vectors_at_about_four_chunks_a_thread(props):
    """norm_l2.cu's forwards: 2- and 4-byte rows of L2_MIN_ROW_BYTES or more in whole 16-byte vectors, up to
    2^31 - 1 rows, a block a row of a power of two threads holding at most L2_CHUNKS chunks each (more only
    where the block is at its largest); rms_norm's (arrays 1) at least L2_RMS_THREADS threads where the row
    has two chunks for each; everything else keeps its plan (None)."""
    largest = min(_launch.L2_THREADS, props.max_threads_per_block)
    for rows, cols, itemsize, arrays in itertools.product(
            (1, 300, 65536, 2**31 + 5), (100, 4096, 4100, 8191, 8192, 12000, 16384, 20000, 32768, 262144), (2, 4, 8),
            (1, 2)):
        p = _launch_norm.norm_l2_plan(rows, cols, itemsize, props, arrays)
        vec = 16 // itemsize
        if itemsize == 8 or cols % vec or cols * itemsize < _launch.L2_MIN_ROW_BYTES or rows >= 2**31:
            assert p is None, (rows, cols, itemsize)  # (a block a row: at most 2^31 - 1 of them)
            continue
        threads, chunks = p.block[0], cols // vec
        assert p.strategy == "l2" and p.grid == (rows,) and p.block == (threads, 1)
        assert threads & (threads - 1) == 0 and threads <= largest
        assert threads * _launch.L2_CHUNKS >= chunks or threads == largest
        floor = min(_launch.L2_RMS_THREADS, largest, _launch._pow2_at_least(-(-chunks // 2))) if arrays == 1 else 1
        assert threads >= floor
        assert threads == floor or (threads // 2) * _launch.L2_CHUNKS < chunks  # not a power of two too many
        # the longest rows in blocks of 1,024: one block an SM (the kernels' registers keep a second out); past 96
        # KiB where the device's bandwidth an SM is known and high (the H200, the B200)
        high = props.mem_gbps > 0 and not _launch_norm.low_bandwidth_per_sm(props)
        one_bytes = _launch.L2_ONE_ROW_BYTES_HIGH_BW if high else _launch.L2_ONE_ROW_BYTES
        longest = cols * itemsize > one_bytes and threads == _launch.L2_THREADS
        # rows past 16 up to 32 KiB of rms_norm and float layer_norm in blocks of 512 there: 3 blocks an SM
        three = high and props.mem_gbps <= _launch.L2_THREE_MAX_SM_GBPS * props.sm_count \
            and _launch.L2_MIN_ROW_BYTES < cols * itemsize <= _launch.L2_THREE_MAX_ROW_BYTES \
            and (arrays == 1 or itemsize == 4) and threads == _launch.L2_THREE_THREADS
        want = _launch.L2_ONE_CHUNKS if longest else _launch.L2_THREE_CHUNKS if three else 0
        assert p.shared_mem == 0 and p.chunks == want, (rows, cols, itemsize)
        b = 1 if longest else 3 if three else 2
        op = "rms_norm" if arrays == 1 else "layer_norm"
        assert _launch_norm.l2_kernel(op, p) == f"{op}_fwd_l2<{b}, {{T}}, {{A}}>"
        assert _launch_norm.l2_kernel(f"add_{op}", p) == f"add_{op}_fwd_l2<{min(b, 2)}, {{T}}, {{A}}>"  # no B = 3
        assert threads == {1: _launch.L2_THREADS, 3: _launch.L2_THREE_THREADS}.get(b, threads)  # the kernels' bounds
    h = _launch_norm.norm_l2_plan
    assert (h(9, 8192, 2, props).block[0], h(9, 8192, 2, props, 1).block[0]) == (256, min(512, largest))
    source = (_sources.KERNEL_DIR / "norm_l2.cu").read_text()
    assert f"#define OPSMITH_L2_THREADS {_launch.L2_THREADS}" in source


def test_norm_l2_plan_gives_rows_past_80_kib_one_block_an_sm():
    """H100: float rows of 24,576 and 32,768 (96 and 128 KiB) and bf16 of 65,536 take the kernels of one block an SM
    (chunks L2_ONE_CHUNKS, no shared memory: their registers keep a second block out), float rows of 20,480 (80 KiB)
    do not; a device whose blocks hold fewer than 1,024 threads keeps two."""
    h, one = _launch_norm.norm_l2_plan, _launch.L2_ONE_CHUNKS
    for arrays in (1, 2):
        assert h(2048, 32768, 4, H100, arrays).chunks == h(2048, 65536, 2, H100, arrays).chunks == one
        assert h(2048, 24576, 4, H100, arrays).chunks == one and h(2048, 20480, 4, H100, arrays).chunks == 0
        assert h(2048, 32768, 4, H100._replace(max_threads_per_block=512), arrays).chunks == 0
        assert h(2048, 32768, 4, H100, arrays).shared_mem == 0
    source = (_sources.KERNEL_DIR / "norm_l2.cu").read_text()
    assert "OPSMITH_L2_THREADS, B)" in source and _launch.L2_THREADS == 1024
    assert f"#define OPSMITH_L2_UNROLL_ONE {one}\n" in source


def test_norm_l2_plan_gives_rows_of_16_to_32_kib_three_blocks_an_sm_on_the_h200():
    """The H200 (36 GB/s of DRAM bandwidth an SM, between LOW_BW_SM_GBPS and L2_THREE_MAX_SM_GBPS): rms_norm's rows of
    more than 16 up to 32 KiB (fp32 4,097-8,192 columns, bf16 8,193-16,384) and float layer_norm's take the kernels of
    B = 3 (blocks of 512, 4 chunks a trip; bench/diag_fwd_l2_trips.py: 1.01-1.05x B = 2's on the H200); bf16
    layer_norm's and the rows of exactly 16 KiB keep B = 2, and so do the H100 (low bandwidth an SM, where norm_c8_plan
    takes these rows), the A100, the B200 (52 GB/s an SM: sm_100's ptxas spills those kernels, unmeasured) and a device
    that does not report its bandwidth."""
    h, three = _launch_norm.norm_l2_plan, _launch.L2_THREE_CHUNKS
    for props in (H200, H200._replace(sm_count=114)):  # (and at 42 GB/s an SM, within the bound)
        for cols, itemsize in ((8192, 4), (6144, 4), (4100, 4), (16384, 2), (8200, 2)):
            p = h(65536, cols, itemsize, props, 1)
            assert (p.block, p.chunks) == ((512, 1), three), (cols, itemsize)
            assert _launch_norm.l2_kernel("rms_norm", p) == "rms_norm_fwd_l2<3, {T}, {A}>"
            assert h(65536, cols, itemsize, props, 2).chunks == (three if itemsize == 4 else 0)
        assert h(65536, 4096, 4, props, 1).chunks == h(65536, 8192, 2, props, 1).chunks == 0  # 16 KiB: 2 chunks each
        assert h(65536, 16384, 4, props, 1).chunks == h(65536, 32768, 2, props, 2).chunks == 0  # 64 KiB: 1,024 threads
    for props in (H100, A100, B200, H200._replace(mem_gbps=0)):
        assert h(65536, 8192, 4, props, 1).chunks == h(65536, 8192, 4, props, 2).chunks == 0
    assert _launch_norm.l2_kernel("add_layer_norm", h(9, 8192, 4, H200, 2)) == "add_layer_norm_fwd_l2<2, {T}, {A}>"
    source = (_sources.KERNEL_DIR / "norm_l2.cu").read_text()
    assert f"#define OPSMITH_L2_THREADS_THREE {_launch.L2_THREE_THREADS}\n" in source
    assert f"#define OPSMITH_L2_UNROLL_THREE {three}\n" in source
    assert "__launch_bounds__(B == 3 ? OPSMITH_L2_THREADS_THREE : OPSMITH_L2_THREADS, B)" in source
    assert {"layer_norm_fwd_l2<3, {T}, {A}>", "rms_norm_fwd_l2<3, {T}, {A}>"} <= set(_sources.FILES["norm_l2.cu"])


def test_add_layer_norm_takes_one_block_an_sm_from_64_kib_rows_where_the_bandwidth_an_sm_is_high():
    """add_layer_norm_l2_plan: layer_norm's L2 plan, but on the H200 and B200 one block an SM (B = 1) from rows of 64
    KiB (fp32 16,384 columns, bf16 32,768), where layer_norm keeps two up to 96 KiB; shorter rows, the H100, the A100
    and a device that does not report its bandwidth keep layer_norm's plan; the add norms never take B = 3."""
    h, one = _launch_norm.add_layer_norm_l2_plan, _launch.L2_ONE_CHUNKS
    for props in (H200, B200):
        for rows, cols, itemsize in ((4096, 16384, 4), (8192, 16384, 4), (4096, 32768, 2), (4096, 24576, 4),
                                     (2048, 32768, 4)):
            p = h(rows, cols, itemsize, props)
            assert p.block == (_launch.L2_THREADS, 1) and p.chunks == one and p.shared_mem == 0, (cols, itemsize)
            assert _launch_norm.l2_kernel("add_layer_norm", p) == "add_layer_norm_fwd_l2<1, {T}, {A}>"
        assert _launch_norm.norm_l2_plan(4096, 16384, 4, props, 2).chunks == 0  # layer_norm: two blocks
        for cols, itemsize in ((12288, 4), (16384, 2), (8192, 4), (100, 4)):
            assert h(64, cols, itemsize, props) == _launch_norm.norm_l2_plan(64, cols, itemsize, props, 2)
        assert _launch_norm.l2_kernel("add_layer_norm", h(64, 8192, 4, props)).startswith("add_layer_norm_fwd_l2<2,")
    for props in (H100, A100, H200._replace(mem_gbps=0)):
        for cols, itemsize in ((16384, 4), (32768, 2), (24576, 4), (8192, 4)):
            assert h(64, cols, itemsize, props) == _launch_norm.norm_l2_plan(64, cols, itemsize, props, 2)
    assert _launch_norm.ADD_LN_ONE_ROW_BYTES == 64 << 10


def test_norm_l2_plan_keeps_two_blocks_an_sm_up_to_96_kib_where_the_bandwidth_an_sm_is_high():
    """H200 and B200 (more than LOW_BW_SM_GBPS of DRAM bandwidth an SM): float rows of 24,576 (96 KiB) keep two blocks
    an SM (bench/diag_fwd_128k.py: 1.08-1.19x one block's on the H200), those of 32,768 (128 KiB) and bf16 of 65,536
    take one; a device that does not report its bandwidth keeps the H100's rule (one block past 80 KiB)."""
    h, one = _launch_norm.norm_l2_plan, _launch.L2_ONE_CHUNKS
    for props, arrays in itertools.product((H200, B200), (1, 2)):
        assert h(4096, 24576, 4, props, arrays).chunks == 0
        assert h(2048, 32768, 4, props, arrays).chunks == h(2048, 65536, 2, props, arrays).chunks == one
    assert h(4096, 24576, 4, H200._replace(mem_gbps=0), 1).chunks == h(4096, 24576, 4, A100, 1).chunks == one
    assert (_launch.L2_ONE_ROW_BYTES, _launch.L2_ONE_ROW_BYTES_HIGH_BW) == (80 << 10, 96 << 10)


class _Held:
    """A kernel whose device holds ``n`` of its clusters at once (Kernel.active_clusters)."""

    def __init__(self, n):
        self.n, self.asked = n, []

    def active_clusters(self, config):
        self.asked.append(config)
        return self.n


@pytest.mark.parametrize("held, groups", [(14, 14), (16, 16), (30, 16), (0, 16), (1, 1)])
def test_cluster_grids_shrink_to_the_clusters_the_device_holds(held, groups):
    """_functional._resident: a persistent cluster plan (here the float rms_norm backward of 32,768 columns on an H100:
    8 blocks of 512 threads, 16 clusters by the SM count) keeps no more clusters than the driver says the device
    holds at once; a count of 0 (the driver cannot say) or more keeps the plan."""
    from opsmith.ops import _functional
    plan = _launch_norm.norm_cluster_plan(4096, 32768, 4, H100, True)
    assert (plan.cluster, plan.block, plan.grid) == (8, (512, 1), (16 * 8,))
    k = _Held(held)
    fitted = _functional._resident(k, plan)
    assert fitted._replace(grid=plan.grid) == plan and fitted.grid == (groups * 8,)
    assert k.asked == [_launch.launch_config(plan)]


@pytest.mark.parametrize("props", PLAN_DEVICES[0], ids=PLAN_DEVICES[1])
def test_softmax_plan_takes_rows_of_whole_warps_at_their_threads(props):
    """The backward of 16-bit rows of C4_MIN_ROW_BYTES or more that are whole warps of WIDE_CHUNKS chunks a thread:
    "wide" at exactly those threads; every other row _softmax_rows' plan, its register rows ("block" at ROW_CHUNKS,
    "wide" at WIDE_CHUNKS) at exactly the threads whose chunks they fill where those are whole warps fewer than its
    power of two, so that they take the unchecked kernels."""
    top = min(_launch.LONG_THREADS, props.max_threads_per_block)
    for rows, cols, itemsize, arrays in itertools.product(
            (1, 300, 65536), (512, 1000, 1024, 2048, 3000, 3072, 4096, 5120, 6144, 8192, 10240, 12000, 12288, 16384,
                              20480, 24576, 32768, 40960), (2, 4, 8), (1, 2)):
        p, q = (f(rows, cols, itemsize, arrays, props) for f in (_launch.softmax_plan, _launch._softmax_rows))
        vec = 16 // itemsize
        t4, rem = divmod(cols, _launch.WIDE_CHUNKS * vec)
        if arrays == 2 and itemsize == 2 and not rem and t4 % 32 == 0 and cols * itemsize >= _launch.C4_MIN_ROW_BYTES \
                and t4 <= top:
            assert p == _launch.Plan("wide", (rows,), (t4, 1), 0, 0), (rows, cols)
            continue
        if q.strategy in ("block", "wide") and not q.chunks and itemsize != 8:  # double keeps its launches
            chunks = _launch.ROW_CHUNKS if q.strategy == "block" else _launch.WIDE_CHUNKS
            t, rem = divmod(cols, chunks * vec)
            if not rem and t % 32 == 0 and t < q.block[0]:
                assert p == q._replace(block=(t, 1)), (rows, cols, itemsize, arrays)
                assert _launch.full_rows(p, cols, itemsize, True, chunks) == (t <= _launch.C4_THREADS or chunks == 2)
                continue
        assert p == q, (rows, cols, itemsize, arrays)
    plan = functools.partial(_launch.softmax_plan, props=props)
    assert plan(4096, 6144, 2, 2) == _launch.Plan("wide", (4096,), (192, 1), 0, 0)  # bf16 6,144: 192 threads, not 256
    assert plan(4096, 6144, 2, 1) == _launch.Plan("wide", (4096,), (192, 1), 0, 0)  # softmax_fwd_wide_full
    assert plan(8, 3072, 4, 1).block == plan(8, 3072, 4, 2).block == (384, 1)  # float 3,072: "block", 384 threads
    assert plan(8, 3000, 2, 2) == _launch.row_plan(8, 3000, 2, 2, props)  # no whole warps: as before
    assert plan(8, 24576, 2, 2).block == (768, 1) and plan(8, 8192, 2, 2).block == (256, 1)  # 16-bit backwards
    assert plan(8, 24576, 2, 1).strategy == ("cluster" if props.clusters else "wide")  # the forward keeps its plan


def test_softmax_forward_takes_the_full_kernel_for_register_rows_that_fill_their_chunks():
    def full(rows, cols, itemsize, aligned=True):
        return _launch.full_rows(_launch.softmax_plan(rows, cols, itemsize, 1, H100), cols, itemsize, aligned)

    assert full(1, 64, 2) and full(1024, 64, 2) and full(7, 256, 2) and full(3, 64, 8)  # warp rows
    assert full(5, 1024, 4) and full(9, 2048, 4) and full(2, 1024, 8)  # rows of a block (128-256 threads)
    assert not full(1, 64, 2, aligned=False) and not full(1, 100, 2) and not full(1, 48, 2)  # a view; checked rows
    assert not full(4, 2048, 2) and not full(4, 16384, 2)  # bf16 from 2 KiB: "wide" (and wide3)
    assert not _launch.full_rows(_launch.softmax_plan(1, 64, 2, 2, H100), 96, 2, True)  # not its row
    wide = _launch.softmax_plan(8, 2048, 2, 1, H100)  # bf16 from 2 KiB: "wide", 4 chunks a thread
    assert wide.strategy == "wide" and _launch.full_rows(wide, 2048, 2, True, _launch.WIDE_CHUNKS)
    assert not _launch.full_rows(wide, 2048, 2, True)  # not at 2 chunks
    assert not _launch.full_rows(_launch.softmax_plan(8, 3000, 2, 1, H100), 3000, 2, True, _launch.WIDE_CHUNKS)
    big = _launch.softmax_plan(8, 32768, 2, 1, _launch.DeviceProps(108, 1024, 2048, 166912, 167936))  # 1,024 threads
    assert big.strategy == "wide" and not _launch.full_rows(big, 32768, 2, True, _launch.WIDE_CHUNKS)
    c4 = _launch_norm.norm_c4_plan(64, 4096, 2, H100)  # norm_c4_plan's rows: layer_norm_fwd_c4_full's
    assert _launch.full_rows(c4, 4096, 2, True, 4) and not _launch.full_rows(c4, 4096, 2, False, 4)
    source = (_sources.KERNEL_DIR / "softmax.cu").read_text()
    assert f"#define OPSMITH_C4_THREADS {_launch.C4_THREADS}" in source  # softmax_fwd_wide_full's bound


def test_softmax_forward_takes_wide3_for_rows_of_its_threads():
    def wide3(cols, itemsize, props=H100, aligned=True):
        return _launch.softmax_fwd_wide3(_launch.softmax_plan(64, cols, itemsize, 1, props), cols, itemsize, aligned)

    assert wide3(9001, 2) == wide3(8200, 2) == wide3(6000, 4) == "softmax_fwd_wide3"
    assert wide3(12288, 2) == wide3(12288, 2, A100) == "softmax_fwd_wide3_full"  # 384 threads' chunks (_whole_warps)
    assert wide3(12288, 2, aligned=False) == "softmax_fwd_wide3"
    assert wide3(16384, 2) == wide3(8192, 4) == "softmax_fwd_wide3_full"  # rows that fill the threads' chunks
    assert wide3(16384, 2, aligned=False) == "softmax_fwd_wide3"  # an unaligned view: the checked kernel
    assert wide3(8192, 2) is None and wide3(4000, 4) is None  # 256 threads a row: softmax_fwd_wide
    assert wide3(3000, 8) is None and wide3(70001, 2) is None and wide3(20000, 2) is None  # double; long; clusters
    assert wide3(9001, 2, A100) == "softmax_fwd_wide3" and wide3(20000, 2, A100) is None  # 1,024 threads: wide
    assert _launch.softmax_fwd_wide3(_launch.softmax_plan(64, 12000, 2, 2, H100), 12000, 2, True) is None  # backward
