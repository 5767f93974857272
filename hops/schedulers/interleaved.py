"""Interleaved 1F1B (Megatron-LM's virtual pipeline; Narayanan et al., SC 2021).

Each stage's layers are split into v model chunks (``pipeline.virtual_stages: v``); chunk c
of stage d is virtual stage c*p + d, so a microbatch loops over the devices v times. Each
device runs 1F1B over its chunks in groups of p microbatches, in the order Megatron's
``forward_backward_pipelining_with_interleaving`` uses: forward k runs chunk (k mod pv) div p
on microbatch (k div pv)*p + k mod p, backward k the chunks in reverse; the warm-up is
2(p - d - 1) + (v - 1)p forwards (all of them when m = p). Megatron requires m to be a
multiple of p. At unit times the bubble is (p - 1)/(v m) of the ideal time, v times
smaller than 1F1B's, for v times the pipeline messages and more activations held early.
Written from the paper and that function's documented order; checked in
tests/test_virtual_stages.py.

``scheduler_options: {warmup: pytorch}`` runs the same order with PyTorch's warm-up
(torch.distributed.pipelining's ScheduleInterleaved1F1B, which torchtitan uses): the same
(v - 1)p + 2(p - d - 1) forwards, capped at mv, but without Megatron's all-forward warm-up
at m = p. It matters for memory, not for time at m = p: there Megatron's device d holds all
mv chunk activations, PyTorch's only its warm-up plus one.
"""
from __future__ import annotations

from hops.schedulers.base import DeviceOrderScheduler, PipelineMeta
from hops.errors import ScenarioError


class Interleaved1F1B(DeviceOrderScheduler):
    name = "interleaved_1f1b"
    default_virtual_stages = 2  # the fewest Megatron interleaves; v is the user's choice beyond that
    option_names = ("warmup",)
    WARMUPS = ("megatron", "pytorch")

    @property
    def megatron_interleaved(self) -> bool:
        """Megatron's order (not PyTorch's, which waits for each step's p2p): the stack's
        `p2p_overlap: interleaved` overlaps its sends."""
        return self.options.get("warmup", "megatron") == "megatron"

    @classmethod
    def placement(cls, p: int, v: int) -> list[tuple[int, int]]:
        if v < 2:  # Megatron runs 1F1B then; this order with one chunk would double its warm-up
            raise ValueError(f"interleaved_1f1b needs at least 2 model chunks per stage (got {v}); "
                             "set pipeline.virtual_stages: 2 or more, or use schedule 1f1b")
        return [(d, c) for c in range(v) for d in range(p)]

    def configure(self, meta: PipelineMeta) -> None:
        v = meta.virtual_stages
        p = meta.n_stages // v
        if meta.n_microbatches % p:
            raise ScenarioError("simulation.microbatches", f"{meta.n_microbatches} microbatches; interleaved 1F1B "
                                f"(Megatron) needs a multiple of the {p} pipeline stages")
        self.warmup = self.options.get("warmup", "megatron")
        if self.warmup not in self.WARMUPS:
            raise ScenarioError("pipeline.scheduler_options.warmup", f"got {self.warmup!r}; expected one of "
                                + ", ".join(self.WARMUPS))
        super().configure(meta)

    def device_order(self, d: int, p: int, v: int, m: int) -> list[tuple[int, str, int]]:
        total = m * v

        def task(k: int, forward: bool) -> tuple[int, str, int]:
            group = k % (p * v)
            chunk = group // p if forward else v - 1 - group // p
            return chunk, "F" if forward else "BW", (k // (p * v)) * p + k % p

        all_forward = m == p and self.warmup == "megatron"
        warm = total if all_forward else min((p - d - 1) * 2 + (v - 1) * p, total)
        order = [task(k, True) for k in range(warm)]
        for k in range(total - warm):
            order += [task(warm + k, True), task(k, False)]
        return order + [task(k, False) for k in range(total - warm, total)]
