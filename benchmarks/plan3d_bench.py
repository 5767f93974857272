"""Plan a 70B-class model on 64 GPUs of two types with the 3D planner, and time it.

The issue's bar: it finishes in under a minute on this machine. Prints the search size, the
wall time, the best plans (simulated), the uniform split of the best plan's stages and the
best plan on each GPU type alone. Model: Llama 2 70B's published shape (Touvron et al. 2023,
Table 1 and the released config: 80 layers, hidden 8192, 64 heads, 8 key/value heads, SwiGLU
FFN 28672, vocabulary 32000, untied), sequence 4096. Inventory: 4 DGX H100 and 4 DGX A100
nodes (8 GPUs each); the prices are illustrative, not quotes.

    python benchmarks/plan3d_bench.py [--global-batch 256]
"""
from __future__ import annotations

import argparse
import time

from hops.planner import Planner3D, Pool

LLAMA2_70B = {"layers": 80, "hidden_dim": 8192, "heads": 64, "kv_heads": 8, "ffn_dim": 28672, "ffn_gated": True,
              "seq_len": 4096, "vocab_size": 32000, "tied_embeddings": False}
INVENTORY = (Pool("h100_sxm", nodes=4, gpus_per_node=8, host="dgx_h100", price_per_gpu_hour=2.5),
             Pool("a100", nodes=4, gpus_per_node=8, host="dgx_a100", price_per_gpu_hour=1.3))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--global-batch", type=int, default=256)
    ap.add_argument("--sharding", default="zero1")
    args = ap.parse_args()
    t0 = time.perf_counter()
    planner = Planner3D(LLAMA2_70B, INVENTORY, global_batch=args.global_batch, sharding=args.sharding)
    result = planner.plan()
    wall = time.perf_counter() - t0
    print(f"70B-class (Llama 2 70B shape, seq 4096) on {sum(p.gpus for p in INVENTORY)} GPUs "
          f"({', '.join(f'{p.gpus} x {p.gpu}' for p in INVENTORY)}), global batch {args.global_batch}, "
          f"sharding {args.sharding}")
    print(f"configurations split: {result.configurations}; planning wall time: {wall:.1f} s "
          f"({'under' if wall < 60 else 'OVER'} the 60 s bar)")

    def row(label, plan):
        if plan is None:
            print(f"  {label:<14} none fits")
            return
        cost = plan.cost_per_sample
        print(f"  {label:<14} {plan.describe():<60} {plan.samples_per_s:8.2f} samples/s"
              f"  {'' if cost is None else f'{cost * 1000:.4f} per 1000 samples'}"
              f"  GPUs {plan.gpus}  peak/GPU {max(plan.memory_mb) / 1000:.1f} GB"
              f"{'  OVER CAPACITY' if plan.over_capacity else ''}")

    for i, plan in enumerate(result.candidates):
        row(f"plan {i + 1}", plan)
    row("uniform split", result.uniform)
    for name, plan in result.single_type.items():
        row(f"only {name.split('@')[0]}", plan)


if __name__ == "__main__":
    main()
