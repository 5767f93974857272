"""Interleaved zero bubble: ZB-H1's split backward on interleaved 1F1B's looping placement, as
PyTorch runs it (torch.distributed.pipelining's ScheduleInterleavedZeroBubble, the schedule
torchtitan calls interleaved zero bubble; its docstring names the Zero Bubble paper's ZB-1p).

Why it is its own schedule and not zb_v: both run two or more model chunks per device with B
and W apart, but the placement decides where the embedding, the LM head and the extra
activations sit. Here chunk c of device d is virtual stage c*p + d, as in interleaved 1F1B, so
the LM head stays on the last device; ZB-V's V brings it back to device 0. A user comparing
torchtitan's two interleaved schedules compares this one with interleaved_1f1b.

The order, as PyTorch's schedule states it (recalled from its source of late 2024, not
re-read here; the rules below are the facts used, in our words):

- Rounds: m microbatches go in max(1, m div p) rounds of r = m / rounds each; m must divide
  evenly (PyTorch refuses otherwise). A device's k-th forward runs chunk (k div r) mod v.
- Warm-up on device d: (v - 1) r + (p - 1 - d) forwards, capped at m v, one hop's worth per
  device fewer than interleaved 1F1B's 2(p - 1 - d) (the last device's W's take the room).
- Then each step is a forward, a backward-for-inputs B (chunks in reverse order), and, from
  the device's (d + 1)-th step on, the W of its oldest B without one; after the last forward
  only B (+ W). The W's still owed run at the end.

So device d starts its W's d steps late, as ZB-H1's stage d does: with one chunk the order is
ZB-H1's (tests/test_interleaved_zb.py), and every device holds at most v p chunk activations
(its warm-up, plus one, plus the d W's it owes), where interleaved 1F1B's device 0 holds
(v - 1) p + 2(p - 1) + 1. PyTorch pads its step lists with idle steps where a dependency is
not met yet; HOPS's engine waits for the input instead, which is the same order in time.

It keeps the optimizer barrier (PyTorch has no post-validation), and needs at least 2 chunks
per device: with one it is zb_h1, which is refused here rather than run under a second name.
"""
from __future__ import annotations

from hops.errors import ScenarioError
from hops.schedulers.base import DeviceOrderScheduler, PipelineMeta
from hops.schedulers.interleaved import Interleaved1F1B


class InterleavedZeroBubble(DeviceOrderScheduler):
    name = "interleaved_zb"
    default_virtual_stages = 2
    option_names = ()
    split_backward = True

    @classmethod
    def placement(cls, p: int, v: int) -> list[tuple[int, int]]:
        if v < 2:
            raise ValueError(f"interleaved_zb needs at least 2 model chunks per stage (got {v}); "
                             "set pipeline.virtual_stages: 2 or more, or use schedule zb_h1")
        return Interleaved1F1B.placement(p, v)

    def configure(self, meta: PipelineMeta) -> None:
        p = meta.n_stages // meta.virtual_stages
        m = meta.n_microbatches
        check_rounds(p, m)
        super().configure(meta)

    def device_order(self, d: int, p: int, v: int, m: int) -> list[tuple[int, str, int]]:
        return device_order(d, p, v, m)


def rounds_divide(p: int, m: int) -> bool:
    """Whether m microbatches fill max(1, m div p) equal rounds, which PyTorch requires."""
    return m % max(1, m // p) == 0


def check_rounds(p: int, m: int) -> None:
    if not rounds_divide(p, m):
        raise ScenarioError("simulation.microbatches", f"{m} microbatches; interleaved_zb (PyTorch's "
                            f"ScheduleInterleavedZeroBubble) runs them in max(1, m div p) = {m // p} equal "
                            f"rounds on {p} stages, which {m} does not divide into")


def device_order(d: int, p: int, v: int, m: int) -> list[tuple[int, str, int]]:
    """(chunk, phase, microbatch) in device d's order; v = 1 gives ZB-H1's stage order."""
    r = m // max(1, m // p)  # microbatches per round
    total = m * v
    warm = min((v - 1) * r + p - 1 - d, total)
    next_mb = {("F", c): 0 for c in range(v)} | {("B", c): 0 for c in range(v)} | {("W", c): 0 for c in range(v)}

    def task(phase: str, chunk: int) -> tuple[int, str, int]:
        j = next_mb[(phase, chunk)]
        next_mb[(phase, chunk)] = j + 1
        return chunk, phase, j

    order = [task("F", (k // r) % v) for k in range(warm)]
    b_chunks: list[int] = []  # chunk of each B, in order: W's follow them oldest first
    for k in range(warm, total + warm):
        if k < total:
            order.append(task("F", (k // r) % v))
        chunk = v - 1 - ((k - warm) // r) % v
        order.append(task("B", chunk))
        b_chunks.append(chunk)
        if k - warm >= d:
            order.append(task("W", b_chunks[k - warm - d]))
    return order + [task("W", c) for c in b_chunks[max(0, total - d):]]
