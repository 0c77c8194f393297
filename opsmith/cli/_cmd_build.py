"""`opsmith build` and `opsmith warm`: build ahead of time."""
from __future__ import annotations

import json
import os
import shlex


def split_flags(values) -> list[str]:
    out: list[str] = []
    for v in values or ():
        out.extend(shlex.split(v))
    return out


def _build(args) -> int:
    from opsmith._torch._extension import build
    name = args.name or os.path.splitext(os.path.basename(args.files[0]))[0].replace("-", "_")
    art = build(name, list(args.files), extra_cflags=split_flags(args.cflags),
                extra_cuda_cflags=split_flags(args.cuda_cflags), extra_ldflags=split_flags(args.ldflags),
                extra_include_paths=args.include or None, verbose=args.verbose, with_cuda=args.cuda,
                is_python_module=args.kind == "module", is_standalone=args.kind == "executable")
    if args.json:
        print(json.dumps({"name": art.name, "kind": art.kind, "path": os.fspath(art.path), "key": art.key,
                          "built": art.built, "compiled_units": art.compiled_units,
                          "seconds": round(art.seconds, 3)}, indent=2))
    elif art.built:
        print(f"built {art.name} ({art.kind}) in {art.seconds:.1f} s, {art.compiled_units} "
              f"unit{'s' * (art.compiled_units != 1)} compiled: {art.path}")
    else:
        print(f"{art.name} ({art.kind}) is already in the cache: {art.path}")
    return 0




def _warm(args) -> int:
    if getattr(args, "ops", False):
        return _warm_ops(args)
    from opsmith._torch._extension import warm
    pch, cxx = warm(with_cuda=args.cuda, extra_cflags=split_flags(args.cflags), verbose=args.verbose)
    what = f"precompiled torch headers for {cxx.family} {cxx.version}"
    if pch.built_seconds is None:
        print(f"{what} are already in the cache ({pch.key[:16]})")
    else:
        print(f"built {what} in {pch.built_seconds:.1f} s ({pch.key[:16]})")
    return 0


def _warm_ops(args) -> int:
    """``opsmith warm --ops``: every opsmith.ops program for the archs, compiled concurrently, and the
    torch C++ libraries the ops run on."""
    import time

    from opsmith._config import settings
    from opsmith.ops import _sources
    archs = list(args.arch or ())
    if not archs and settings.cuda_arch:
        archs = [settings.cuda_arch]
    if not archs:
        from opsmith._torch._cuda_module import _current_arch
        archs = [_current_arch()]
    for arch in archs:
        start = time.perf_counter()
        binaries = _sources.warm(arch)
        compiled = sum(not b.from_cache for b in binaries)
        kernels = sum(len(b.lowered_names) for b in binaries)
        print(f"opsmith.ops for {arch}: {len(binaries)} programs ({kernels} kernels), {compiled} compiled, "
              f"{len(binaries) - compiled} from the cache, in {time.perf_counter() - start:.1f} s")
    _warm_native(settings)
    return 0


def _warm_native(settings) -> None:
    """The torch C++ libraries opsmith.ops runs on (its CUDA kernels, the native Autograd kernels):
    built for this torch now rather than at the ops' first use."""
    import time

    from opsmith._torch import _autograd_native
    from opsmith.ops import _native
    for name, on, build in (("native CUDA kernels (opsmith/ops/native/osm_ops.cpp)", settings.ops_native,
                             _native.build),
                            ("native Autograd kernels (opsmith/_torch/autograd/osm_autograd.cpp)",
                             settings.torch_op_native_autograd, _autograd_native.build)):
        if not on:
            continue
        start = time.perf_counter()
        build()
        print(f"opsmith.ops {name}: ready for this torch in {time.perf_counter() - start:.1f} s")

