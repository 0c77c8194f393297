"""A stand-in for a kernel's launch in the CPU tests of opsmith.ops' CUDA paths (the Python CUDA
implementations run on CPU tensors, each launch checked instead of run). Not a test module."""
from __future__ import annotations

__all__ = ["CheckedLaunch"]


class CheckedLaunch:
    """Stands in for a kernel's launch: checks every argument against the kernel's parsed
    signature (count, tensor dtype and contiguity, int and float kinds) and the config."""

    def __init__(self, kernel, calls):
        self.kernel, self.calls = kernel, calls

    def active_clusters(self, config):
        """Kernel.active_clusters: a device that holds 3 clusters at once (the persistent cluster grids shrink)."""
        return 3

    def launch(self, config, *args):
        import torch
        from opsmith._runtime._launch_config import LaunchConfig
        k = self.kernel
        assert isinstance(config, LaunchConfig)
        assert len(args) == len(k.params), (k.name, len(args), [p.name for p in k.params])
        for p, a in zip(k.params, args):
            if p.kind == "tensor":
                assert isinstance(a, torch.Tensor) and a.is_contiguous(), (k.name, p.name)
                assert str(a.dtype).replace("torch.", "") in p.dtypes, (k.name, p.name, a.dtype, p.dtypes)
            elif p.kind == "int":
                assert type(a) is int and p.range[0] <= a <= p.range[1], (k.name, p.name, a)
            else:
                assert type(a) is float, (k.name, p.name, a)
        self.calls.append((k.name, config))
