"""Scheduler registry: built-ins by name, user schedulers by registered name or dotted path."""
from __future__ import annotations

import importlib

from hops.errors import echo
from hops.schedulers.base import DeviceOrderScheduler, PipelineMeta, Scheduler, SchedulerState, StaticOrderScheduler, Task
from hops.schedulers.classic import GPipe, OneFOneB
from hops.schedulers.hetero_search import HeteroSearch
from hops.schedulers.hops_hetero import HopsHetero
from hops.schedulers.interleaved import Interleaved1F1B
from hops.schedulers.interleaved_zb import InterleavedZeroBubble
from hops.schedulers.zb_auto import ZB1P, ZB2P, ZBAuto
from hops.schedulers.zb_v import ZBV
from hops.schedulers.zero_bubble import ZBH1, ZBH2, ZeroBubble

_REGISTRY: dict[str, type[Scheduler]] = {cls.name: cls for cls in (GPipe, OneFOneB, ZBH1, ZBH2, ZBV, ZBAuto, ZB1P,
                                                                   ZB2P, Interleaved1F1B, InterleavedZeroBubble,
                                                                   HopsHetero, HeteroSearch)}
_REGISTRY["zero_bubble"] = ZBH1  # alias: the paper's ZB-H1 (Qi et al., ICLR 2024)


def register(cls: type[Scheduler]) -> type[Scheduler]:
    """Class decorator: make a Scheduler subclass available by its `name`."""
    _REGISTRY[cls.name] = cls
    return cls


def available() -> list[str]:
    return sorted(_REGISTRY)


def honouring_post_validation() -> list[str]:
    """Registered names whose schedule runs under optimizer post-validation."""
    return [name for name in available() if _REGISTRY[name].post_validation]


def resolve_scheduler(name: str) -> type[Scheduler]:
    """A registered name, or 'package.module:Class' / 'package.module.Class' for a plug-in."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if "." in name or ":" in name:
        module, _, attr = name.replace(":", ".").rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise KeyError(f"cannot import scheduler {echo(name)} ({exc})") from None
        if not (isinstance(cls, type) and issubclass(cls, Scheduler)):
            raise KeyError(f"{echo(name)} is not a hops.schedulers.Scheduler subclass")
        return cls
    raise KeyError(f"unknown scheduler {echo(name)}; expected one of {', '.join(available())} or a dotted path")


__all__ = ["PipelineMeta", "Scheduler", "SchedulerState", "StaticOrderScheduler", "Task", "register",
           "available", "resolve_scheduler", "DeviceOrderScheduler", "GPipe", "OneFOneB", "Interleaved1F1B",
           "InterleavedZeroBubble", "ZBH1", "ZBH2", "ZBV", "ZBAuto", "ZB1P", "ZB2P", "ZeroBubble", "HopsHetero",
           "HeteroSearch"]
