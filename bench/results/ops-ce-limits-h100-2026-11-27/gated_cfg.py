"""bench/diag_gated.py's configurations (rows a thread, blocks an SM) on the 1-2 GiB shapes."""
import os, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/
import diag_gated  # noqa: E402
diag_gated.SHAPES = [(32768, 8192), (65536, 8192), (4096, 4096)]
diag_gated.CONFIGS = {"r1 b6 (shipped)": (1, 6), "r2 b4": (2, 4), "r2 b2": (2, 2), "r1 b8": (1, 8), "r4 b2": (4, 2)}
sys.argv = ["diag_gated", "--json", os.path.join(os.environ["OUT"], "gated_cfg.json"), "--runs", "30"]
sys.exit(diag_gated.main())
