"""The published schedule measurements HOPS is checked against, each as scenarios built from
the model's published shape, the published figure with its source, and the assumptions
where the source is silent.

A case compares schedules by the ratio of their throughput (or of their bubble, memory and
communication at unit times) to a reference schedule's, because that is what the sources
publish and what a user ranks schedules by. Nothing here is fitted: the scenarios use the
default training stack (megatron_core, hops/presets/stacks.yaml) and spec-sheet GPU presets.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

# Published shapes (layers, hidden, heads, kv_heads, ffn_dim, gated FFN, vocab, tied embeddings)
INTERNLM_7B = {"layers": 32, "hidden_dim": 4096, "heads": 32, "ffn_dim": 11008, "ffn_gated": True,
               "vocab_size": 103168, "tied_embeddings": False}  # InternLM-7B config (internlm/internlm-7b)
LLAMA3_8B = {"layers": 32, "hidden_dim": 4096, "heads": 32, "kv_heads": 8, "ffn_dim": 14336, "ffn_gated": True,
             "vocab_size": 128256, "tied_embeddings": False}  # Llama 3 paper (Dubey et al. 2024), Table 3


@dataclass(frozen=True)
class Row:
    """One published figure: a schedule's `metric` relative to the reference schedule's."""

    schedule: str
    published: float
    metric: str = "throughput"  # throughput | bubble | activation_memory | pipeline_messages
    note: str = ""
    formula: float | None = None  # the same figure from the source's own formula, where it gives one


@dataclass(frozen=True)
class Reading:
    """Another reading of something the source leaves open, as a change to every scenario of the
    case: how far the prediction moves under it says how much the open assumption weighs."""

    label: str
    change: Callable[[dict], None]  # edits a scenario document in place


def on_gpu(gpu: str, host: str) -> Callable[[dict], None]:
    def change(doc: dict) -> None:
        doc["hardware"]["host"] = host
        for d in doc["hardware"]["devices"]:
            d["gpu"] = gpu
    return change


def stack_option(**options) -> Callable[[dict], None]:
    def change(doc: dict) -> None:
        doc["pipeline"].setdefault("stack_options", {}).update(options)
    return change


def untied_embeddings(doc: dict) -> None:
    doc["pipeline"]["model"]["tied_embeddings"] = False


def one_fewer_at_the_ends(doc: dict) -> None:
    """The first and last stage one layer short of the others: layers = p k - 2 stated per stage."""
    stages = doc["pipeline"]["stages"]
    k = (doc["pipeline"]["model"]["layers"] + 2) // len(stages)
    for i, st in enumerate(stages):
        st["layers"] = k - 1 if i in (0, len(stages) - 1) else k


def precision(name: str) -> Callable[[dict], None]:
    def change(doc: dict) -> None:
        doc["pipeline"]["precision"] = name
    return change


def dp_sharding(sharding: str) -> Callable[[dict], None]:
    def change(doc: dict) -> None:
        doc["optimizer"]["data_parallel"]["sharding"] = sharding
    return change


@dataclass(frozen=True)
class Case:
    name: str
    source: str
    reference: str  # the schedule the published ratios divide by
    rows: tuple[Row, ...]
    build: Callable[[str, str], dict]  # (schedule, grid point) -> scenario document
    assumptions: tuple[str, ...]
    memory_gib: dict = field(default_factory=dict)  # schedule -> {device: published GiB}
    grid: tuple[str, ...] = ("",)  # an "up to" figure is the best ratio over these settings
    tokens_per_gpu: dict = field(default_factory=dict)  # schedule -> published tokens/s per GPU, where given
    readings: tuple[Reading, ...] = ()  # other readings of what the source leaves open


def cluster(p: int, *, gpu: str, host: str, model: dict, seq_len: int, micro_batch: int, microbatches: int,
            schedule: str, layers: int | str, dp: int = 1, dp_link: str | None = None, virtual: int = 1,
            post_validation: bool = False, options: dict | None = None, stack_options: dict | None = None,
            precision: str = "bf16") -> dict:
    """p pipeline stages on p GPUs, 8 to a host, 3 iterations with the Adam step; the stack is
    the default one (megatron_core)."""
    opt = {"enabled": True, "post_validation": post_validation}
    if dp > 1:
        opt["data_parallel"] = {"degree": dp, "interconnect": dp_link}
    return {
        "simulation": {"batches": 3, "microbatches": microbatches, "micro_batch_size": micro_batch, "seed": 0},
        "pipeline": {"schedule": schedule, "precision": precision, "virtual_stages": virtual, "model": {**model, "seq_len": seq_len},
                     "scheduler_options": options or {}, "stack_options": stack_options or {},
                     "stages": [{"device": f"gpu{i}", "layers": layers} for i in range(p)]},
        "hardware": {"host": host, "devices": [{"id": f"gpu{i}", "gpu": gpu, "node": f"node{i // 8}"}
                                               for i in range(p)],
                     "interconnect": {"cross_node": "infiniband"}},
        "optimizer": opt,
    }


def internevo(schedule: str, _: str = "") -> dict:
    return cluster(4, gpu="a800", host="hgx_a800", model=INTERNLM_7B, seq_len=2048, micro_batch=1, microbatches=8,
                   schedule=schedule, layers=8, dp=2, dp_link="nvlink_400")


def torchtitan(schedule: str, _: str = "") -> dict:
    return cluster(8, gpu="h100_sxm", host="dgx_h100", model=LLAMA3_8B, seq_len=512, micro_batch=2, microbatches=8,
                   schedule=schedule, layers=4, virtual=2, stack_options={"p2p_overlap": False}, precision="fp32",
                   options={"warmup": "pytorch"} if schedule == "interleaved_1f1b" else None)


# The Zero Bubble paper's Table 3 settings, as recalled (not re-read here: see the assumptions):
# (name, layers, hidden, heads, pipeline stages = GPUs, micro-batch size, smallest m of its sweep)
ZB_PAPER_MODELS = (("1.5B", 22, 2304, 24, 8, 6, 24), ("6.2B", 30, 4096, 32, 8, 3, 24),
                   ("14.6B", 46, 5120, 40, 16, 1, 48), ("28.3B", 62, 6144, 48, 32, 1, 96))


# The ZB paper's and repository's ZB-H2, ZB-V, ZB-1p and ZB-2p run with optimizer post-validation (the paper's
# section 5): no cross-stage barrier before the optimizer step, so their steady state carries over.
POST_VALIDATED = ("zb_h2", "zb_v", "zb_1p", "zb_2p")


def zb_paper(schedule: str, which: str) -> dict:
    _, layers, h, heads, p, mbs, m = next(c for c in ZB_PAPER_MODELS if c[0] == which)
    model = {"layers": layers, "hidden_dim": h, "heads": heads, "vocab_size": 50304}  # GPT, ffn 4h, tied
    return cluster(p, gpu="a100", host="dgx_a100", model=model, seq_len=1024, micro_batch=mbs, microbatches=m,
                   schedule=schedule, layers="auto", virtual=2 if schedule == "zb_v" else 1,
                   post_validation=schedule in POST_VALIDATED)


def unit_times(schedule: str, _: str = "", p: int = 4, m: int = 16, f: float = 1.0, b: float = 1.0,
               w: float = 1.0) -> dict:
    """F, B (input gradient) and W of f, b and w ms on every stage (1 each: the ZB repository
    table's setting), free links, no optimizer."""
    v = 2 if schedule == "zb_v" else 1  # ZB-V's two chunks per stage each take half: 1/2 ms per pass
    comp = {"mode": "distribution", "forward": {"kind": "constant", "ms": f},
            "backward_b": {"kind": "constant", "ms": b}, "backward_w": {"kind": "constant", "ms": w}}
    return {
        "simulation": {"batches": 6, "microbatches": m, "seed": 0},
        "pipeline": {"schedule": schedule, "virtual_stages": v, "activation_mb": 1.0, "host_overhead":
                     {"kind": "constant", "ms": 0.0},
                     "stages": [{"device": f"g{i}", "weights_mb": 0.0, "activation_memory_mb": 1000.0,
                                 "compute": comp} for i in range(p)]},
        "hardware": {"devices": [{"id": f"g{i}", "gpu": "a100", "node": f"n{i}"} for i in range(p)]},
        "overrides": {"links": [{"src": f"g{i}", "dst": f"g{j}", "latency_ms": 0.0, "bandwidth_gbps": 1e9,
                                 "jitter": 0.0} for i in range(p) for j in range(p) if i != j]},
        # the table's zero bubble is ZB-H2's and ZB-V's steady state across iterations, which a
        # cross-stage barrier would block
        "optimizer": {"enabled": False, "post_validation": schedule in POST_VALIDATED},
    }


def interleaved_unit_times(schedule: str, _: str = "") -> dict:
    """The ZB table's unit times with Megatron's two model chunks per stage for interleaved 1F1B."""
    doc = unit_times(schedule)
    doc["pipeline"]["virtual_stages"] = 2 if schedule == "interleaved_1f1b" else 1
    return doc


# DeepSeek-V3 case: F, the input-gradient part of B and W, in ms (B = 2.3 in the report's notation)
DS_F, DS_B, DS_W, DS_P, DS_M = 1.0, 1.5, 0.8, 4, 16


def unequal_times(schedule: str, _: str = "") -> dict:
    return unit_times(schedule, p=DS_P, m=DS_M, f=DS_F, b=DS_B, w=DS_W)


def deepseek_bubble(bubble_time: float) -> float:
    """A per-iteration bubble time of the report's table as the benchmark's bubble: over the
    iteration's own work, m (F + B + W)."""
    return bubble_time / (DS_M * (DS_F + DS_B + DS_W))


CASES = (
    Case(
        name="InternEvo PR #282: InternLM-7B, dp 2 x pp 4, m 8",
        source="InternEvo pull request #282 (zero-bubble pipeline, 2024): ZB-H1 +11.4 % tokens/s over 1F1B",
        reference="1f1b", rows=(Row("zb_h1", 1.114),), build=internevo,
        assumptions=("GPUs: A800 80GB SXM, 8 on one HGX node (NVLink 400 GB/s), the lab's usual hardware; "
                     "the PR does not say",
                     "micro-batch size 1, sequence 2048 (the PR's seq); 8 layers per stage",
                     "data parallelism: each stage's fp32 gradients ring-all-reduced over NVLink at the end of the "
                     "iteration (optimizer.data_parallel, no sharding, not overlapped: the stack's "
                     "dp_overlap_grad_reduce is false); whether the PR ran ZeRO-1 is not stated",
                     "untied embeddings (InternLM-7B); default stack megatron_core (flash attention, async dispatch)",
                     "activation recomputation: none (the PR does not say)"),
        readings=(Reading("H800 on an HGX H800 node", on_gpu("h800", "hgx_h800")),
                  Reading("ZeRO-1 over the two replicas", dp_sharding("zero1")),
                  Reading("gradient reduction behind the last backward", stack_option(dp_overlap_grad_reduce=True)),
                  Reading("full activation recomputation", stack_option(recompute="full")))),
    Case(
        name="torchtitan #773: Llama-3-8B, pp 8, interleaved",
        source="pytorch/torchtitan issue #773 (2024): interleaved 1F1B 304 tokens/s, interleaved zero bubble 339 "
               "(+11.5 %); memory rank 0 / rank 7: 22.74 / 17.97 GiB vs 20.57 / 22.23 GiB",
        reference="interleaved_1f1b", rows=(Row("interleaved_zb", 339 / 304),),
        build=torchtitan,
        memory_gib={"interleaved_1f1b": {"gpu0": 22.74, "gpu7": 17.97},
                    "interleaved_zb": {"gpu0": 20.57, "gpu7": 22.23}},
        tokens_per_gpu={"interleaved_1f1b": 304, "interleaved_zb": 339},
        assumptions=("GPUs: 8 x H100 SXM on one DGX H100 node (NVLink 4); the issue's logs do not name them",
                     "batch 16 = 8 microbatches of 2 sequences of 512; 2 model chunks per rank, 2 layers each",
                     "interleaved 1F1B with PyTorch's warm-up (scheduler_options warmup: pytorch; torchtitan runs "
                     "torch.distributed.pipelining's ScheduleInterleaved1F1B): (v-1)p + 2(p-1-d) warm-up forwards, "
                     "without Megatron's all-forward warm-up at m = p, so rank 7 holds 9 chunk activations, rank 0 "
                     "16 (Megatron's order: 16 on every rank)",
                     "interleaved zero bubble as HOPS's interleaved_zb (hops/schedulers/interleaved_zb.py): "
                     "torch.distributed.pipelining's ScheduleInterleavedZeroBubble order as recalled from its "
                     "source, not re-read here: (v-1)p + (p-1-d) warm-up forwards, B and W apart, device d's W's d "
                     "steps late, so every rank holds 16 chunk activations",
                     "p2p not overlapped (stack_options p2p_overlap: false, stated: megatron_core overlaps only "
                     "Megatron's own interleaved order): torch.distributed.pipelining waits for each step's "
                     "batched sends and receives before its next action (as recalled from its source, not "
                     "re-read here)",
                     "the published tokens/s are per GPU: torchtitan's logged throughput divides by the "
                     "pipeline's GPUs (as recalled); if they were the pipeline's total, HOPS's absolute "
                     "over-prediction below would be 8 times larger",
                     "no activation checkpointing (as published); default stack megatron_core",
                     "precision fp32, which the issue does not state: torchtitan applied bf16 through FSDP's "
                     "mixed-precision policy only (as recalled, not re-read), which a pp-only run does not use, "
                     "and PyTorch leaves allow_tf32 off for matmuls, so the GEMMs run on the FP32 units; weights, "
                     "gradients and Adam's m and v in fp32 (16 B/param) and fp32 activations. Until the formula "
                     "audit the case read bf16 (Megatron's mixed precision, now the reading below), because HOPS "
                     "charged an fp32 run 24 B/param of Adam state, which put this reading at 46 GiB against the "
                     "published 18-23; at 8 B/param it is the reading nearest every published figure (memory, "
                     "tokens/s and the ratio). The switch was made with those figures in view",
                     "the issue does not say whether its memory figure is allocated or reserved memory",
                     "not counted: the LM-head stage's fp32 logits (s b V x 4 B, 0.49 GiB per microbatch here) "
                     "while a microbatch's loss awaits its backward; counting them would raise rank 7, where "
                     "HOPS is already above the published figure"),
        readings=(Reading("A100 80GB SXM on a DGX A100", on_gpu("a100", "dgx_a100")),
                  Reading("bf16 mixed precision (18 B/param: bf16 weight, fp32 main grad, master, m, v)",
                          precision("bf16")))),
    Case(
        name="Zero Bubble paper: GPT 1.5B-28.3B on 8-32 A100",
        source="Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024: up to +23 % over 1F1B at similar memory, "
               "up to +31 % with memory relaxed (best cases over its Table 3 grid)",
        reference="1f1b",
        rows=(Row("zb_1p", 1.23, note="up to, 1F1B memory"), Row("zb_2p", 1.31, note="up to, relaxed memory")),
        build=zb_paper, grid=tuple(c[0] for c in ZB_PAPER_MODELS),
        assumptions=("shapes of the paper's Table 3 as recalled, not re-read for this benchmark: "
                     + "; ".join(f"{n} {lay} layers, h {h}, {a} heads, p {p}, micro-batch {b}, m {m}"
                                 for n, lay, h, a, p, b, m in ZB_PAPER_MODELS)
                     + "; seq 1024, vocab 50304, FFN 4h, tied embeddings",
                     "each model at the smallest m of its sweep, where the gain is largest; the 'up to' figure is "
                     "compared with HOPS's best ratio over the grid",
                     "A100 80GB SXM, 8 per node with DGX A100 NICs; the paper used RoCE between nodes",
                     "layers split by layers: auto (the paper does not list its split)",
                     "ZB-1p and ZB-2p with optimizer post-validation, as the paper runs them",
                     "ZB-1p and ZB-2p are HOPS's zb_1p and zb_2p (hops/schedulers/zb_auto.py): the paper's "
                     "Section 3.1 heuristic at memory limits of p and 2p microbatch activations per stage, its two "
                     "hyperparameters grid-searched by replay at the expected times. Not implemented: the paper's ILP "
                     "refinement of the heuristic's order; since its optimum is no longer than any order within the "
                     "limit, HOPS keeps the handcrafted ZB-H1 / ZB-H2 among the candidates instead, and runs "
                     "whichever replays shortest (an ILP may find shorter orders than both)",
                     "what the paper leaves open: what a stage does while the alternation's next F or B has not "
                     "arrived (HOPS tries waiting, running the other one if it ends first, and running whichever "
                     "arrives first, a third grid-searched hyperparameter), and the memory model: HOPS holds a "
                     "microbatch's activations until its W ends, while the paper frees all but M_W at B, so HOPS's "
                     "limits are at least as tight as the paper's"),
        readings=(Reading("untied embeddings (no first-last stage embedding sync)", untied_embeddings),
                  Reading("one layer fewer on the first and last stage (Table 3's layer counts are all p k - 2)",
                          one_fewer_at_the_ends))),
    Case(
        name="ZB repository table: F = B = W, p 4, m 16",
        source="sail-sg/zero-bubble-pipeline-parallelism README table: bubble (p-1)/m, (p-1)/3m, 0, 0; activation "
               "memory 1x, 1x, 2x, 1x; pipeline communication 1x, 1x, 1x, 2x for 1F1B, ZB-H1, ZB-H2, ZB-V",
        reference="1f1b",
        rows=(Row("1f1b", 3 / 16, "bubble", "(p-1)/m"), Row("zb_h1", 3 / 48, "bubble", "(p-1)/3m"),
              Row("zb_h2", 0.0, "bubble"), Row("zb_v", 0.0, "bubble"),
              Row("zb_h1", 1.0, "activation_memory"), Row("zb_h2", 2.0, "activation_memory", "ZB paper Table 1: (2p-1) M_B over p M_B",
                  formula=(2 * 4 - 1) / 4),
              Row("zb_v", 1.0, "activation_memory"),
              Row("zb_h1", 1.0, "pipeline_messages"), Row("zb_h2", 1.0, "pipeline_messages"),
              Row("zb_v", 2.0, "pipeline_messages")),
        build=unit_times,
        assumptions=("bubble = (period - 3m) / 3m, the period being the steady-state time per iteration: the time between the last two of 6 iterations' ends (the table is a steady state; the first fill is paid once)",
                     "ZB-H2 and ZB-V with optimizer post-validation (no barrier between iterations), as the "
                     "repository runs them; ZB-V at its default in-flight cap (2p chunk activations, 1F1B's memory)",
                     "ZB-V's zero comes from HOPS's building-block rule (hops/schedulers/zb_v.py), which builds "
                     "a zero-bubble order at 2p chunk activations wherever p divides m >= 2p (here 4 | 16); "
                     "HOPS's list rules alone finish device 0 last in every iteration and keep (p-1)/6m = 0.031. "
                     "Where p does not divide m the rule misses and HOPS's ZB-V keeps a bubble, though orders "
                     "without one exist (python -m experiments.literature.zbv_order 3 7 finds one)",
                     "activation memory: the peak of the stage holding most (1000 MB per microbatch and stage)",
                     "ZB-H2's published 2x is the rounded, large-p figure: the ZB paper's Table 1 gives its peak as "
                     "(2p-1) M_B against 1F1B's p M_B, 1.75x at p 4; the error column is against the published 2x")),
    Case(
        name="Megatron-LM interleaved schedule: unit times, p 4, m 16, v 2",
        source="Narayanan et al., Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM, "
               "SC21, sec. 2.2: bubble time fraction (p-1)/m for 1F1B, (p-1)/(vm) with v model chunks per device",
        reference="1f1b",
        rows=(Row("1f1b", 3 / 16, "bubble", "(p-1)/m"), Row("interleaved_1f1b", 3 / 32, "bubble", "(p-1)/(vm)")),
        build=interleaved_unit_times,
        assumptions=("the ZB table's unit times (F 1 ms; B and W 1 ms each, run fused: the paper's backward is "
                     "one pass of twice the forward), free links; bubble as in that case, over m (F + B + W)",
                     "v = 2 chunks of half a stage each on every device, Megatron's order (m a multiple of p); "
                     "tests/test_literature.py also checks v = 4",
                     "not a row: the paper's 'communication increases by v', an approximation; HOPS counts "
                     "2m(vp - 1) messages per iteration against 1F1B's 2m(p - 1), 2.33x at v 2 and p 4")),
    Case(
        name="DeepSeek-V3 report, Table 2: bubbles at unequal F, B, W (p 4, m 16)",
        source="DeepSeek-AI, DeepSeek-V3 Technical Report (2024), Table 2: pipeline bubble (PP-1)(F+B) for 1F1B and "
               "(PP-1)(F+B-2W) for ZB1P, B being the full backward (input and weight gradients); activation "
               "memory PP for both",
        reference="1f1b",
        rows=(Row("1f1b", deepseek_bubble((DS_P - 1) * (DS_F + DS_B + DS_W)), "bubble", "(PP-1)(F+B)"),
              Row("zb_h1", deepseek_bubble((DS_P - 1) * (DS_F + DS_B + DS_W - 2 * DS_W)), "bubble",
                  "(PP-1)(F+B-2W)"),
              Row("zb_1p", deepseek_bubble((DS_P - 1) * (DS_F + DS_B + DS_W - 2 * DS_W)), "bubble",
                  "(PP-1)(F+B-2W)")),
        build=unequal_times,
        assumptions=(f"F = {DS_F:g}, input gradient {DS_B:g} and W = {DS_W:g} ms (B = {DS_B + DS_W:g} in the "
                     "report's notation) on every stage, free links: the table is symbolic; these times are unequal so "
                     "that its W term shows (tests/test_literature.py checks both formulas at five such triples)",
                     "bubble as in the ZB repository case: (period - work) / work per iteration, the period read "
                     "in the steady state, work = m (F + B + W); the table's bubble time divided by that work",
                     "ZB1P is the ZB paper's ZB-1p: HOPS's zb_1p (automatic, at 1F1B's memory) and zb_h1, its "
                     "handcrafted order at that memory, both listed",
                     "not run: the table's DualPipe row, (PP/2-1)(F&B+B-3W) at twice the parameters and PP+1 "
                     "activations; HOPS has no DualPipe schedule and no model of a forward and a backward chunk "
                     "overlapped on one GPU")),
)
