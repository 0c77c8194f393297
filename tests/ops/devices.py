"""Synthetic devices for the launch-plan tests of opsmith.ops (CPU; not a test module): H100-like, H200-like
(the H100's SMs, more DRAM bandwidth), B200-like (148 SMs, 52 GB/s of DRAM an SM), A100-like (no clusters), and a
small part with the classic 48 KiB of shared memory whose memory bandwidth is not known."""
from __future__ import annotations

from opsmith.ops._launch import DeviceProps

__all__ = ["A100", "B200", "H100", "H200", "PLAN_DEVICES", "SMALL"]

H100 = DeviceProps(sm_count=132, max_threads_per_block=1024, max_threads_per_sm=2048,
                   smem_per_block_optin=232448, smem_per_sm=233472, clusters=True, mem_gbps=3352)
H200 = H100._replace(mem_gbps=4814)
B200 = DeviceProps(148, 1024, 2048, 232448, 233472, clusters=True, mem_gbps=7672)
A100 = DeviceProps(108, 1024, 2048, 166912, 167936, mem_gbps=2039)
SMALL = DeviceProps(8, 1024, 1536, 49152, 65536)

# the devices every plan test runs on (pytest.mark.parametrize("props", *PLAN_DEVICES))
PLAN_DEVICES = ([H100, H200, B200, A100, SMALL], ["H100", "H200", "B200", "A100", "small"])
