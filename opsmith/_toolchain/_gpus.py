"""The identity of this boot's visible GPU set, read from a few small files (no CUDA call).

Machine-local memos keyed by it (the visible GPUs' archs, the warm index) are re-read after a
reboot, a driver change or another ``CUDA_VISIBLE_DEVICES``.
"""
from __future__ import annotations

import hashlib
import os

__all__ = ["gpu_fingerprint"]


def gpu_fingerprint() -> str:
    """Cheap identity of this boot's visible GPU set: no CUDA call, a few small file reads."""
    parts = [os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"), os.environ.get("NVIDIA_VISIBLE_DEVICES", "")]
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            parts.append(f.read().strip())
    except OSError:
        parts.append("no-boot-id")
    try:
        parts.extend(sorted(os.listdir("/proc/driver/nvidia/gpus")))
    except OSError:
        parts.append("no-nvidia-proc")
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]
