"""How much does a background compile slow a torch module's calls, by how it is started?

    python bench/lltm/diag_pch_interference.py [--trials 5] [--calls 2000]

opsmith builds its precompiled torch header in a background process after a first build, so
the user's script runs beside it. This starts the same compile (clang++ precompiling
`torch/extension.h` with `-fpch-instantiate-templates`) under each policy in turn, waits a
second, times three rounds of `--calls` LLTM forward calls (bench/lltm/lltm.cpp, float64,
16x32, state 128; torch's default threads), then kills it:

- none:         no background compile
- session+nice: a new session and nice 10 (opsmith before issue 24: a new session is a new
                scheduler autogroup, so the nice value counts only inside it)
- group+idle:   the caller's session, a process group of its own, SCHED_IDLE (opsmith now)

The policies take turns within each trial, so that other load on a shared machine falls on
all of them; the figures are the medians over trials of each trial's median round.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
INCLUDE = os.path.join(os.path.dirname(torch.__file__), "include")


def _session_nice() -> None:
    os.setsid()
    os.nice(10)


def _group_idle() -> None:
    os.setpgid(0, 0)
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


POLICIES = {"none": None, "session+nice": _session_nice, "group+idle": _group_idle}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    if not hasattr(os, "SCHED_IDLE"):
        sys.exit("this platform has no SCHED_IDLE")
    work = tempfile.mkdtemp(prefix="diag-pch-interference-")
    os.environ["OPSMITH_CACHE_DIR"] = os.path.join(work, "cache")
    os.environ["OPSMITH_PCH"] = "0"  # this build starts no background job of its own
    import opsmith
    m = opsmith.load("lltm_interference", [os.path.join(HERE, "lltm.cpp")])
    header = os.path.join(work, "pch.h")
    with open(header, "w") as f:
        f.write("#include <torch/extension.h>\n")
    compile_cmd = ["clang++", "-std=c++20", "-fPIC", "-isystem", INCLUDE,
                   "-isystem", os.path.join(INCLUDE, "torch", "csrc", "api", "include"),
                   "-isystem", sysconfig.get_paths()["include"], "-x", "c++-header", header,
                   "-fpch-instantiate-templates", "-o", header + ".pch"]
    g = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, dtype=torch.float64, generator=g)
    X, h, c, W, B = rand(16, 32), rand(16, 128), rand(16, 128), rand(384, 160), rand(1, 384)
    for _ in range(50):
        m.forward(X, W, B, h, c)
    per_policy: dict[str, list[float]] = {p: [] for p in POLICIES}
    still_running = {p: 0 for p in POLICIES}
    for trial in range(args.trials):
        for name, setup in POLICIES.items():
            bg = None
            if setup is not None:
                bg = subprocess.Popen(compile_cmd, preexec_fn=setup,  # noqa: PLW1509 - one thread here stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
                time.sleep(1.0)
            rounds = []
            for _ in range(3):
                t = time.perf_counter()
                for _ in range(args.calls):
                    m.forward(X, W, B, h, c)
                rounds.append(time.perf_counter() - t)
            if bg is not None:
                still_running[name] += bg.poll() is None
                bg.kill()
                bg.wait()
            per_policy[name].append(statistics.median(rounds))
            print(f"trial {trial + 1} {name:13s} " + " ".join(f"{r:.3f}" for r in rounds), flush=True)
    print(f"{args.calls} forward calls beside a background compile; median over {args.trials} trials "
          f"(torch threads {torch.get_num_threads()}, {os.cpu_count()} cores):")
    for name, values in per_policy.items():
        note = "" if POLICIES[name] is None else f"  (compile still running at the end: {still_running[name]}/{args.trials})"
        print(f"  {name:13s} {statistics.median(values):.3f} s   trials: "
              + " ".join(f"{v:.3f}" for v in values) + note)


if __name__ == "__main__":
    main()
