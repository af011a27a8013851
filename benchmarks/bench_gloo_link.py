"""What a gloo all-gather costs between the processes of one host: latency and bandwidth, bare.

The replay's nominal link for CPU ranks (``fsdpviz.replay.comm.NOMINAL_LINK``: 140 µs a call, 3.0 ms at
8 MB) is read here: where a recording's sizes cannot tell a collective's latency from its bandwidth,
its time is split as this link splits its own at that size.

    python benchmarks/bench_gloo_link.py [--ranks 2]

Prints, per message size (the unsharded bytes of the gather), the lower quartile and median over
30 gathers, each after a barrier, then the line through the quartiles of the smallest and largest size.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import warnings

SIZES = (16_000, 51_000, 200_000, 476_000, 2_000_000, 8_000_000)
REPEATS = 30


def rank_main() -> None:
    """One rank: gather every size REPEATS times after a barrier; rank 0 prints the quartiles."""
    import torch
    import torch.distributed as dist

    warnings.simplefilter("ignore", FutureWarning)  # all_gather_into_tensor's deprecation, on every call
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    quartiles = {}
    for nbytes in SIZES:
        shard = torch.ones(nbytes // 4 // world)
        out = torch.empty(shard.numel() * world)
        for _ in range(5):
            dist.all_gather_into_tensor(out, shard)
        times = []
        for _ in range(REPEATS):
            dist.barrier()
            start = time.perf_counter()
            dist.all_gather_into_tensor(out, shard)
            times.append(time.perf_counter() - start)
        times.sort()
        quartiles[nbytes] = times[len(times) // 4] * 1e6
        if rank == 0:
            print(f"| {nbytes:,} | {quartiles[nbytes]:.1f} | {times[len(times) // 2] * 1e6:.1f} |")
    if rank == 0:
        small, large = SIZES[0], SIZES[-1]
        per_byte_us = (quartiles[large] - quartiles[small]) / (large - small)
        print(f"\nlatency {quartiles[small] - small * per_byte_us:.0f} us, bandwidth {1e-3 / per_byte_us:.2f} GB/s")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args()
    print(f"{args.ranks} gloo ranks, {os.cpu_count()} logical CPUs\n")
    print("| bytes | lower quartile (us) | median (us) |\n|---:|---:|---:|", flush=True)
    env = {**os.environ, "FSDPVIZ_GLOO_RANK": "1"}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                    str(args.ranks), __file__], check=True, env=env)


if __name__ == "__main__":
    if os.environ.get("FSDPVIZ_GLOO_RANK"):
        rank_main()
    else:
        main()
