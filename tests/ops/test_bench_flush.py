"""bench/_flush.py on CPU: the benchmark's flush is swapped inside ``flush_mode`` alone, and a flush it does not
know is refused (the ``last`` flush itself needs Triton and a GPU: bench/diag_flush.py runs it on the device)."""
from __future__ import annotations

import pytest

from opsmith.ops import _bench

from bench_files import load  # tests/ops/bench_files.py (pytest puts tests/ops on the path)


def test_flush_mode_swaps_the_benchmarks_flush_inside_the_block_alone():
    flush = load("_flush")
    plain = _bench._l2_flusher
    seen = []
    with flush.flush_mode("last"):
        assert _bench._l2_flusher is not plain
        flush.flusher = lambda mode, device: seen.append((mode, device))  # no GPU here: record what it asks for
        _bench._l2_flusher("cuda:0")
    assert seen == [("last", "cuda:0")] and _bench._l2_flusher is plain
    with pytest.raises(RuntimeError), flush.flush_mode("zero"):
        raise RuntimeError("a benchmark that fails")
    assert _bench._l2_flusher is plain  # restored on the way out of a failure too


@pytest.mark.parametrize("mode", ["none", "", "LAST"])
def test_a_flush_it_does_not_know_is_refused_with_the_choices(mode):
    flush = load("_flush")
    for call in (lambda: flush.flusher(mode, "cuda:0"), lambda: flush.flush_mode(mode).__enter__()):
        with pytest.raises(ValueError, match="one of zero, last"):
            call()
    assert _bench._l2_flusher is flush._plain
