"""The benchmark scripts' plot: a panel per (op, direction, dtype), each implementation's GB/s
against the bytes moved, the device's copy bandwidth as a line (bench_ops.py's ops.png,
bench_ops_peers.py's peers.png)."""
from __future__ import annotations

import sys

MIB = 1 << 20


def panels(records, styles: dict, path, title: str, copy_gbps: float | None, points_only=lambda op: True) -> None:
    """Draw ``records`` (each with ``op``, ``dir``, ``dtype``, ``bytes`` and ``results[impl]
    ["gbps"]``) to ``path``: one panel per (op, dir, dtype) in order of appearance, one series per
    ``styles`` entry (implementation -> matplotlib format); ``points_only(op)``: no lines (several
    shapes move the same bytes)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib, then redraw with "
              "--plot-only results.json)", file=sys.stderr)
        return
    keys = list(dict.fromkeys((r["op"], r["dir"], r["dtype"]) for r in records))
    if not keys:
        return
    cols = 4
    rows = -(-len(keys) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        recs = sorted((r for r in records if (r["op"], r["dir"], r["dtype"]) == key), key=lambda r: r["bytes"])
        for impl, style in styles.items():
            pts = [(r["bytes"] / MIB, r["results"][impl]["gbps"]) for r in recs
                   if r["results"].get(impl, {}).get("gbps")]
            if pts:
                kw = {"linestyle": "none"} if points_only(key[0]) else {}
                ax.plot(*zip(*pts), style, label=impl, markersize=4, linewidth=1, **kw)
        if copy_gbps:
            ax.axhline(copy_gbps, color="gray", linewidth=1, label="device copy")
        ax.set_xscale("log")
        ax.set_title(" ".join(key), fontsize=10)
        ax.set_xlabel("bytes moved (MiB)")
        ax.set_ylabel("GB/s")
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
