"""Synthetic devices for the launch-plan tests of opsmith.ops (CPU; not a test module): H100-like, H200-like
(the H100's SMs, more DRAM bandwidth), A100-like, and a small part with the classic 48 KiB of shared memory
whose memory bandwidth is not known."""
from __future__ import annotations

from opsmith.ops._launch import DeviceProps

__all__ = ["A100", "H100", "H200", "SMALL"]

H100 = DeviceProps(sm_count=132, max_threads_per_block=1024, max_threads_per_sm=2048,
                   smem_per_block_optin=232448, smem_per_sm=233472, clusters=True, mem_gbps=3352)
H200 = H100._replace(mem_gbps=4814)
A100 = DeviceProps(108, 1024, 2048, 166912, 167936, mem_gbps=2039)
SMALL = DeviceProps(8, 1024, 1536, 49152, 65536)
