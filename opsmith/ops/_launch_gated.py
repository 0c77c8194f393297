"""gated.cu's launches (silu_and_mul, gelu_and_mul and their two-tensor forms): the rows a thread takes
(``gated_shape``, gated.cu's ``GatedShape``), the 2-D grid (``gated_plan``) and where the one-vector kernels
may run (``gated_one``). The block size is :mod:`opsmith.ops._launch`'s ``EW_THREADS``; CPU tests check
these rules on synthetic devices and against gated.cu's macros."""
from __future__ import annotations

import functools

from opsmith.ops._launch import EW_THREADS, DeviceProps, Plan, _cdiv, _pow2_at_least

__all__ = ["GATED_BLOCKS16", "GATED_GRID", "GATED_ROWS", "GATED_ROWS16", "gated_one", "gated_plan", "gated_shape"]

GATED_ROWS = 2        # OPSMITH_GATED_ROWS in gated.cu: rows a thread loads per trip (the erf GELU; float, double)
GATED_ROWS16 = 1      # OPSMITH_GATED_ROWS16: the same for silu and the tanh GELU on 16-bit types
GATED_BLOCKS16 = 6    # OPSMITH_GATED_BLOCKS16: their __launch_bounds__' blocks an SM (40 registers a thread)

# gated_plan's rows, per activation: (trips of GATED_ROWS rows a thread makes, blocks of EW_THREADS an
# SM holds for the kernels' registers: silu and the tanh GELU 53-80 a thread, the erf GELU 71-96).
# silu and the tanh GELU on 16-bit types take one row a thread instead (gated_shape).
GATED_GRID = {"silu": (1, 4), "gelu_tanh": (1, 4), "gelu": (4, 2)}


def gated_shape(act: str, itemsize: int) -> tuple[int, int, int]:
    """(rows a thread loads a trip, trips, blocks an SM) of gated.cu's ``act`` kernels on elements of
    ``itemsize`` bytes: its ``GatedShape`` (silu and the tanh GELU on 16-bit types: one row, one trip,
    GATED_BLOCKS16 blocks; else GATED_ROWS rows and ``GATED_GRID[act]``)."""
    if itemsize == 2 and act != "gelu":
        return GATED_ROWS16, 1, GATED_BLOCKS16
    trips, per_sm = GATED_GRID[act]
    return GATED_ROWS, trips, per_sm


@functools.lru_cache(maxsize=4096)
def gated_plan(rows: int, d: int, itemsize: int, props: DeviceProps, act: str = "silu") -> Plan:
    """gated.cu's 2-D launch over ``rows`` rows of ``d`` outputs: a block of ``EW_THREADS``
    threads, ``tx`` along a row's 16-byte vectors (fewer for short rows) and ``256 / tx`` rows,
    each thread the rows and trips of :func:`gated_shape` and at most one row a thread.

    - silu and the tanh GELU on 16-bit types: one row a thread, the whole grid at once. Measured on
      an H200 (bench/results/ops-gated-h200-2026-11-26/gated-small.txt, bf16, kernels alone, L2
      flushed): 1-6 % faster than two rows a trip folded into one wave over 2048-65536 rows x
      1024-4096 (silu 2048x2048 backward 15.49 -> 15.15 us, the tanh GELU's 16.08 -> 15.17).
    - the others: at least one wave of blocks (the blocks the SMs hold at once for the kernels'
      registers); where one trip a thread would take at most two waves, one wave of more trips
      runs instead (the second wave was mostly tail). Measured on an H200
      (bench/results/ops-qk-llama-h200-2026-11-26/diag-gated-grid.txt): the erf GELU 4 trips, 6-26 %
      faster than 1 (bf16 8192x8192: forward 127.9 -> 112.2 us, backward 212.2 -> 195.5).

    The kernel's loops stride by the grid, so any grid (a capped one: 65,535 row blocks) stays correct.
    """
    units = max(1, _cdiv(d, 16 // itemsize))
    threads = min(EW_THREADS, props.max_threads_per_block)
    tx = min(threads, _pow2_at_least(units))
    ty = threads // tx
    gx = min(_cdiv(units, tx), 2**31 - 1)
    per_trip, trips, per_sm = gated_shape(act, itemsize)
    one_row = _cdiv(max(rows, 1), ty)
    if per_trip * trips == 1:
        return Plan("gated", (gx, min(one_row, 65535)), (tx, ty), 0, 0)
    wave = props.sm_count * min(per_sm, max(1, props.max_threads_per_sm // threads))
    gy = _cdiv(max(rows, 1), ty * per_trip * trips)
    if trips == 1 and gx * gy <= 2 * wave:
        gy = _cdiv(wave, gx)
    gy = min(one_row, max(gy, _cdiv(wave, gx)))
    return Plan("gated", (gx, min(gy, 65535)), (tx, ty), 0, 0)


def gated_one(plan: Plan, rows: int, d: int, itemsize: int, act: str, addresses, strides) -> bool:
    """Whether gated.cu's ``<op>_one`` kernels (one 16-byte vector of one row a thread, int indices,
    no address tests) can take ``plan``'s launch: an activation of one row a thread (gated_shape), a
    grid that covers every row and vector once, every address 16-byte aligned and every row stride
    (in elements) whole vectors and below 2**31."""
    vec = 16 // itemsize
    (gx, gy), (tx, ty) = plan.grid, plan.block
    return (gated_shape(act, itemsize)[:2] == (1, 1) and gy * ty >= rows and gx * tx * vec >= d and d % vec == 0
            and rows < 2**31 and d < 2**31 and all(a % 16 == 0 for a in addresses)
            and all(s % vec == 0 and 0 <= s < 2**31 for s in strides))
