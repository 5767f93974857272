"""Writes the study's own stress configs (configs/*.yaml); the YAMLs are committed, this is
how they were made and what each one is for.

    python -m experiments.hetero_scheduler.make_configs

Each config stresses the scheduler differently from the 16 reference pipelines (which are
all four stages, floor-bound, and bottlenecked on the last stage by its LM head): depth 6-16,
H100/A100/L4/A10G mixes, compute-bound stages (a GPT-style model with hidden 4096 and
sequence 2048: one layer is 24*s*h^2 = 0.82 TFLOP forward per sample, so an L4 takes ~7 ms
per layer where the 1.4 ms dispatch floor no longer dominates), a tail bottleneck, two
separated bottlenecks, a slow head, and nominally homogeneous clusters with 5-15%
stragglers (MegaScale's observed range) set through overrides.devices.<id>.slowdown.
"""
from __future__ import annotations

from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent / "configs"
H, S = 4096, 2048
LAYER_TFLOP = 24 * S * H * H / 1e12          # forward FLOPs of one layer, one sample
LAYER_WEIGHT_MB = 12 * H * H * 2 / 1e6       # bf16 weights of one layer (4h^2 attention + 8h^2 MLP)
LM_WEIGHT_MB = H * 50304 * 2 / 1e6


def stage(device: str, layers: float, last: bool = False, first: bool = False) -> dict:
    weights = layers * LAYER_WEIGHT_MB + (LM_WEIGHT_MB if last or first else 0.0)
    return {"device": device, "weights_mb": round(weights, 1),
            "compute": {"mode": "analytical", "tflop": round(layers * LAYER_TFLOP, 4),
                        "memory_mb": round(layers * LAYER_WEIGHT_MB, 1)}}


def config(name: str, doc: str, gpus: list[str], layers: list[float], m: int, *, per_node: int = 1,
           slowdown: dict[int, float] | None = None, same_node: str = "nvlink", cross_node: str = "infiniband",
           hidden: int = H, seq: int = S, batches: int = 1) -> tuple[str, str, dict]:
    assert len(gpus) == len(layers)
    p = len(gpus)
    devices = [{"id": f"{g}_{i}", "gpu": g, "node": f"n{i // per_node}", "socket": 0} for i, g in enumerate(gpus)]
    scale = 24 * seq * hidden * hidden / 1e12 / LAYER_TFLOP
    stages = []
    for i, (d, n) in enumerate(zip(devices, layers)):
        st = stage(d["id"], n, last=i == p - 1, first=i == 0)
        st["compute"]["tflop"] = round(st["compute"]["tflop"] * scale, 4)
        stages.append(st)
    doc_ = {
        "simulation": {"batches": batches, "microbatches": m, "seed": 42, "micro_batch_size": 1},
        "pipeline": {"schedule": "zero_bubble", "precision": "bf16", "backward_factor": 2.0,
                     "model": {"hidden_dim": hidden, "seq_len": seq}, "stages": stages},
        "hardware": {"devices": devices, "interconnect": {"same_node": same_node, "cross_node": cross_node}},
        "optimizer": {"enabled": False},
        "failure": {"enabled": False},
        "output": {},
    }
    if slowdown:
        doc_["overrides"] = {"devices": {devices[i]["id"]: {"slowdown": f} for i, f in slowdown.items()}}
    return name, doc, doc_


CONFIGS = [
    config("d6_h100_a100_tail", "tail bottleneck: 4 H100 then 2 A100 (4 layers each); the A100 tail also runs "
           "the LM head", ["h100"] * 4 + ["a100"] * 2, [4] * 6, 24, per_node=4),
    config("d6_l4_head", "slow head: an L4 first stage (2 layers) feeding 5 A100 (4 layers each)",
           ["l4"] + ["a100"] * 5, [2] + [4] * 5, 24, per_node=1, cross_node="ethernet"),
    config("d6_a10g_middle", "middle bottleneck: A100s around one A10G holding 2 layers",
           ["a100", "a100", "a10g", "a100", "a100", "a100"], [4, 4, 2, 4, 4, 3], 32, per_node=2),
    config("d8_mix4_balanced", "H100, A100, A10G, L4 pairs with layers roughly proportional to speed",
           ["h100", "h100", "a100", "a100", "a10g", "a10g", "l4", "l4"], [8, 8, 4, 4, 1.5, 1.5, 1.5, 1], 32,
           per_node=2),
    config("d8_two_bottlenecks", "two separated bottlenecks: L4 at stages 1 and 5 in an A100 pipeline",
           ["a100", "l4", "a100", "a100", "a100", "l4", "a100", "a100"], [4, 1.5, 4, 4, 4, 1.5, 4, 3], 32,
           per_node=4),
    config("d12_two_bottlenecks_h100", "two separated bottlenecks: A10G at stages 3 and 9 among H100s",
           ["h100"] * 3 + ["a10g"] + ["h100"] * 5 + ["a10g"] + ["h100"] * 2, [4] * 3 + [1] + [4] * 5 + [1] + [4, 3],
           32, per_node=4),
    config("d8_a100_straggler10", "nominally homogeneous 8 x A100, stage 3 a 10% straggler",
           ["a100"] * 8, [4] * 8, 32, per_node=8, slowdown={3: 1.10}),
    config("d12_a100_stragglers", "homogeneous 12 x A100, stragglers of 5% (stage 2) and 15% (stage 8)",
           ["a100"] * 12, [3] * 12, 32, per_node=4, slowdown={2: 1.05, 8: 1.15}),
    config("d16_h100_straggler", "homogeneous 16 x H100 (floor-bound at 2 layers), one 12% straggler at stage 6",
           ["h100"] * 16, [2] * 16, 32, per_node=8, slowdown={6: 1.12}),
    config("d16_a10g_l4_floor", "16 floor-bound stages like the reference study, 8 A10G then 8 L4, deeper",
           ["a10g"] * 8 + ["l4"] * 8, [2] * 16, 32, per_node=1, cross_node="ethernet", hidden=1024, seq=1024),
    config("d16_mix4_interleaved", "16 stages, H100/A100/A10G/L4 interleaved, layers proportional to speed",
           ["h100", "a100", "a10g", "l4"] * 4, [6, 3, 1, 1] * 4, 48, per_node=4),
    config("d10_l4_tail_bottleneck", "tail bottleneck: 8 A10G then 2 L4 carrying as many layers",
           ["a10g"] * 8 + ["l4"] * 2, [1] * 10, 32, per_node=1, cross_node="ethernet"),
    config("d6_homog_a10g_straggler6", "homogeneous 6 x A10G, a 6% straggler at the head",
           ["a10g"] * 6, [1] * 6, 24, per_node=1, cross_node="ethernet", slowdown={0: 1.06}),
    config("d8_slow_links", "8 A100 on single-GPU nodes over ethernet with seq 8192: transfers matter",
           ["a100"] * 8, [2] * 8, 24, per_node=1, cross_node="ethernet", seq=8192),
]


def main() -> None:
    HERE.mkdir(parents=True, exist_ok=True)
    for name, doc, data in CONFIGS:
        text = f"# {doc}\n# generated by experiments/hetero_scheduler/make_configs.py\n" + \
            yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120)
        (HERE / f"{name}.yaml").write_text(text)
    print(f"wrote {len(CONFIGS)} configs to {HERE}")


if __name__ == "__main__":
    main()
