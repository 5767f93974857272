"""The 3D planner: the best plan of its search space, checked by brute force on a small case,
and refusals that name the field."""
import itertools
import math

import pytest

import hops
from hops.errors import HopsError, ScenarioError
from hops.planner import Planner3D, Pool

TINY = {"layers": 4, "hidden_dim": 512, "heads": 8, "seq_len": 512, "vocab_size": 8000}
POOLS = (Pool("h100_sxm", nodes=1, gpus_per_node=4, host="dgx_h100", price_per_gpu_hour=2.0),
         Pool("a100", nodes=1, gpus_per_node=2, host="dgx_a100", price_per_gpu_hour=1.0))


def brute_force(pl: Planner3D):
    """Every plan of the search space, written out without the planner's search: each pool
    unused or wholly used at a power-of-two TP dividing its node and the heads (TP > 1 only over
    the host's gpu_link), every DP degree
    splitting the batch, every order of the stages, every split of the layers that fits."""
    total, best = pl.arch.layers, None
    rows = pl.global_batch // pl.micro_batch_size
    for d in range(1, max(p.gpus for p in pl.pools) + 1):
        if rows % d:
            continue
        m = rows // d
        per_pool = []
        for pool in pl.pools:
            link = pool.host is not None and pl.catalog.hosts[pool.host].get("gpu_link")
            tps = [t for t in (1, 2, 4, 8) if t <= pool.gpus_per_node and pool.gpus % (d * t) == 0
                   and pl.arch.heads % t == 0 and (t == 1 or link)]
            per_pool.append([None] + tps)
        for choice in itertools.product(*per_pool):
            kinds = [(k, t) for k, t in enumerate(choice) if t is not None
                     for _ in range(pl.pools[k].gpus // (d * t))]
            p = len(kinds)
            if not kinds or p > min(pl.max_pipeline, total):
                continue
            for seq in set(itertools.permutations(kinds)):
                pos = ["only"] if p == 1 else ["first"] + ["mid"] * (p - 2) + ["last"]
                for cuts in itertools.combinations(range(1, total), p - 1):
                    layers = [b - a for a, b in zip((0,) + cuts, cuts + (total,))]
                    tabs = [pl.table(k, t) for k, t in seq]
                    if any(tab.memory(n, ps, d, min(p - i, m)) > tab.capacity
                           for i, (tab, n, ps) in enumerate(zip(tabs, layers, pos))):
                        continue
                    ts = [tab.time(n, ps) for tab, n, ps in zip(tabs, layers, pos)]
                    es = [tab.end_cost(n, ps, d) for tab, n, ps in zip(tabs, layers, pos)]
                    est = (m - 1) * max(ts) + sum(ts) + max(es) + pl.transfers_ms(seq)
                    per_sample = est / (d * m * pl.micro_batch_size)
                    if best is None or per_sample < best[0] - 1e-12:
                        best = (per_sample, d, seq, layers)
    return best


SMALL_CASES = {
    # the optimum is a TP-4 A100 group then two L40S stages, split 7 / 2 / 1
    "a100-tp4+l40s": ({"layers": 10, "hidden_dim": 4096, "heads": 32, "seq_len": 2048, "vocab_size": 32000},
                      (Pool("a100", nodes=1, gpus_per_node=4, host="dgx_a100"), Pool("l40s", nodes=2,
                                                                                       gpus_per_node=1))),
    # memory forces six stages; the A10Gs take the ends, the split is uneven
    "l4+a10g": ({"layers": 10, "hidden_dim": 5120, "heads": 40, "seq_len": 4096, "vocab_size": 32000},
                (Pool("l4", nodes=1, gpus_per_node=4, host="aws_g6"), Pool("a10g", nodes=2, gpus_per_node=1,
                                                                            host="aws_g5"))),
    "tiny": (TINY, POOLS),
}


@pytest.mark.parametrize("case", sorted(SMALL_CASES))
@pytest.mark.parametrize("batch", [8, 12])
def test_the_planner_finds_the_brute_force_optimum_of_its_estimate(case, batch):
    model, pools = SMALL_CASES[case]
    pl = Planner3D(model, pools, global_batch=batch)
    want = brute_force(pl)
    got = pl.plan(verify=False).best
    assert got.estimate_ms / got.samples_per_iteration == pytest.approx(want[0], rel=1e-12)


def test_verified_plans_are_simulated_and_never_slower_than_the_uniform_split_of_their_stages():
    r = Planner3D(TINY, POOLS, global_batch=8).plan(verify_top=2)
    assert all(c.simulated_ms is not None for c in r.candidates)
    assert r.best.samples_per_s >= r.uniform.samples_per_s * (1 - 1e-9)
    assert set(r.single_type) == {"h100_sxm@dgx_h100", "a100@dgx_a100"}
    assert r.best.samples_per_s >= max(p.samples_per_s for p in r.single_type.values()) * (1 - 1e-9)
    # cost per sample: the priced GPU-hours of every GPU the plan uses over the samples it trains
    gpus = r.best.gpus
    price = sum(n * (2.0 if name.startswith("h100") else 1.0) for name, n in gpus.items())
    assert r.best.cost_per_sample == pytest.approx(price / 3600 / r.best.samples_per_s)


def test_a_plan_becomes_a_scenario_of_one_replica_with_its_dp_degree():
    import hops

    pl = Planner3D(TINY, POOLS, global_batch=8)
    best = pl.plan(verify=False).best
    doc = pl.scenario(best)
    sc = hops.load_scenario(doc)
    assert [st.tp for st in sc.stages] == [tp for _, tp in best.stages]
    assert [int(st.layers) for st in sc.stages] == best.layers
    assert sc.dp_degree == best.dp and sc.microbatches * best.dp * sc.micro_batch_size == 8


def test_the_runs_stack_options_reach_the_plans_scenario_and_its_memory():
    """A request's training.stack_options (here Megatron's full recomputation) are the plan's
    scenario's: the same plan then holds only each layer's input."""
    import hops

    plain = Planner3D(TINY, POOLS, global_batch=8)
    best = plain.plan(verify=False).best
    doc = Planner3D(TINY, POOLS, global_batch=8, stack_options={"recompute": "full"}).scenario(best)
    assert hops.load_scenario(doc).stack_options == {"recompute": "full"}
    full, none = hops.simulate(doc).summary, hops.simulate(plain.scenario(best)).summary
    assert all(full["peak_memory_mb"][g] < none["peak_memory_mb"][g] for g in none["peak_memory_mb"])


def test_memory_limits_the_split():
    """A model that one GPU of a pool cannot hold is planned over more of them, or refused."""
    big = {"layers": 8, "hidden_dim": 8192, "heads": 64, "seq_len": 4096, "vocab_size": 32000}
    one_gpu = (Pool("l4", nodes=1, gpus_per_node=1),)
    with pytest.raises(HopsError, match="no plan fits"):
        Planner3D(big, one_gpu, global_batch=4).plan(verify=False)
    r = Planner3D(big, (Pool("h100_sxm", nodes=2, gpus_per_node=8, host="dgx_h100"),), global_batch=4).plan(
        verify=False)
    assert all(u <= c for u, c in zip(r.best.memory_mb, r.best.capacity_mb))


def test_a_dp_degree_the_inventory_cannot_supply_is_refused_naming_the_field():
    pl = Planner3D(TINY, POOLS, global_batch=64)
    with pytest.raises(ScenarioError) as exc:
        pl.plan(dp=8, verify=False)
    msg = str(exc.value)
    assert msg.startswith("training.data_parallel:") and "\n" not in msg and "4 x h100_sxm" in msg
    assert pl.plan(dp=2, verify=False).best.dp == 2


@pytest.mark.parametrize("field,pools,model", [
    ("inventory[0].gpu", (Pool("gb9000", nodes=1),), TINY),
    ("inventory[0].host", (Pool("a100", nodes=1, host="dgx_z"),), TINY),
    ("model.heads", POOLS, {k: v for k, v in TINY.items() if k != "heads"}),
])
def test_bad_requests_name_the_field(field, pools, model):
    with pytest.raises(ScenarioError, match=f"^{field.replace('[', '.').replace(']', '.')}"):
        Planner3D(model, pools, global_batch=8)


def test_the_search_counts_grow_as_documented():
    """With at most max_orders orders a sequence's orders are all enumerated, else the pools in blocks."""
    pl = Planner3D(TINY, POOLS, global_batch=8, max_orders=1)
    seqs = [s for d, s in pl.configurations() if d == 1 and len({k for k, _ in s}) == 2]
    # blocks only: each mixed (tp choice) gives 2 orders
    per_choice = {}
    for s in seqs:
        per_choice.setdefault(tuple(sorted(set(s))), []).append(s)
    assert all(len(v) == 2 for v in per_choice.values())
    assert math.comb(4, 2) > 2  # a mixed 2+2 pipeline would have 6 orders without the limit


def request_file(tmp_path, **training):
    import yaml

    doc = {"model": TINY, "inventory": [{"gpu": "h100_sxm", "host": "dgx_h100", "nodes": 1, "gpus_per_node": 4,
                                         "price_per_gpu_hour": 2.0}],
           "training": {"global_batch": 8, **training}}
    path = tmp_path / "request.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_the_cli_prints_the_plans_and_writes_the_best_as_a_scenario(tmp_path, capsys):
    import hops
    from hops.plan import main

    out = tmp_path / "best.yaml"
    assert main([str(request_file(tmp_path, schedules=["1f1b"])), "--top", "1", "--scenario", str(out)]) == 0
    text = capsys.readouterr().out
    assert "plan 1" in text and "uniform split" in text and "cost/sample" in text
    assert hops.simulate(str(out)).summary["throughput"]["samples_per_s"] > 0


@pytest.mark.parametrize("training,field", [({"data_parallel": 64}, "training.data_parallel"),
                                            ({"global_batch": 0}, "training.global_batch"),
                                            ({"sharding": "zero9"}, "training.sharding"),
                                            ({"stack_options": {"recompute": "most"}},
                                             "training.stack_options.recompute"),
                                            ({"schedules": ["1f1b", "fifo"]}, "training.schedules[1]: unknown"),
                                            ({"schedules": ["zb_v"]}, "training.schedules[0]: zb_v runs 2 model"),
                                            ({"schedules": ["interleaved_zb"]}, "training.schedules[0]"),
                                            ({"schedules": []}, "training.schedules: expected at least one")])
def test_the_cli_refuses_a_bad_request_in_one_line(tmp_path, capsys, training, field):
    from hops.plan import main

    assert main([str(request_file(tmp_path, **training))]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and field in err, err


@pytest.mark.parametrize("text,words", [("", "request: the file is empty; expected a mapping"),
                                        ("- a\n- b\n", "request: the file's top level is a list; expected a mapping")])
def test_a_request_that_is_no_mapping_is_one_line_naming_the_file(tmp_path, capsys, text, words):
    from hops.plan import main

    f = tmp_path / "req.yaml"
    f.write_text(text)
    assert main([str(f)]) == 2
    assert capsys.readouterr().err.strip() == f"error: {f}: {words} with model, inventory and training"


def test_an_unknown_gpu_of_the_inventory_names_the_request_file(tmp_path, capsys):
    from hops.plan import main

    f = request_file(tmp_path)
    f.write_text(f.read_text().replace("gpu: ", "gpu: x", 1))
    assert main([str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {f}: inventory[0].gpu: got 'x") and "\n" not in err, err


def test_the_plan_table_survives_a_reader_that_stops_after_one_line(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run(f"{sys.executable} -m hops.plan {request_file(tmp_path)} | head -1", shell=True,
                          capture_output=True, text=True, timeout=300)
    assert proc.stdout.endswith("configurations searched; simulated plans, best first:\n") and not proc.stderr, \
        proc.stderr


def test_a_mixture_of_experts_without_expert_parallelism_is_planned_by_its_active_and_held_weights():
    """Every expert on every replica: the plan's GPUs hold all experts' weights (more memory
    than the dense model) and run top_k of them per token (more time than the dense model)."""
    moe = {**TINY, "moe": {"experts": 4, "top_k": 2}}
    dense, mixed = (Planner3D(m, POOLS, global_batch=8).plan(dp=1, verify=False).best for m in (TINY, moe))
    assert mixed.samples_per_s < dense.samples_per_s
    assert max(mixed.memory_mb) > max(dense.memory_mb)


def test_an_expert_parallel_model_is_planned_only_over_multiples_of_its_expert_parallelism():
    """The experts spread over e data-parallel replicas: every candidate's DP degree is a multiple
    of e, the best plan's scenario says so and simulates, and a fixed degree that e does not
    divide is a one-line error naming training.data_parallel."""
    moe = {**TINY, "moe": {"experts": 4, "top_k": 2, "expert_parallel": 2}}
    pl = Planner3D(moe, POOLS, global_batch=8)
    assert {d for d, _ in pl.configurations()} <= {2, 4, 6}
    best = pl.plan(verify=False).best
    assert best.dp % 2 == 0
    doc = pl.scenario(best)
    assert doc["optimizer"]["data_parallel"]["degree"] == best.dp
    assert hops.simulate(doc).summary["throughput"]["samples_per_s"] > 0
    with pytest.raises(ScenarioError, match=r"^training\.data_parallel: degree 1: expected a multiple of "
                                            r"model\.moe\.expert_parallel \(2\)$"):
        pl.plan(dp=1, verify=False)


# under full recomputation four A10Gs at seq 8192: 1F1B's level lets through splits whose ZB-H1
# run overruns a GPU (its later stages hold microbatches past their B, ~16 stashes each)
LONG = {"layers": 12, "hidden_dim": 4096, "heads": 32, "seq_len": 8192, "vocab_size": 32000}
A10GS = (Pool("a10g", nodes=4, gpus_per_node=1),)


def test_under_full_recomputation_a_split_backward_schedule_is_sized_with_its_deferred_ws():
    """Sized at ZB-H1's own order, each W waiting with its GEMMs' operands and the last stage's
    with the LM head's logits gradient, the estimate is the simulated peak and every plan fits."""
    pl = Planner3D(LONG, A10GS, global_batch=8, stack_options={"recompute": "full"})
    for c in pl.plan(schedules=["zb_h1"], verify=False).candidates:
        run = pl.simulate(c, "zb_h1")
        assert not run.over_capacity, c.describe()
        assert c.memory_mb == pytest.approx(run.memory_mb, rel=1e-9)
    assert not pl.plan(schedules=["zb_h1"]).best.over_capacity


def test_asked_for_1f1b_and_zb_h1_under_full_recomputation_each_is_searched_at_its_own_level():
    """1F1B's splits no longer stand for ZB-H1's: the search also sizes splits for ZB-H1, so a
    ZB-H1 plan within memory is among those simulated, and each plan runs the schedules it fits."""
    pl = Planner3D(LONG, A10GS, global_batch=8, stack_options={"recompute": "full"})
    r = pl.plan(schedules=["1f1b", "zb_h1"], verify_top=6)
    assert any(c.schedule == "zb_h1" and not c.over_capacity for c in r.candidates)
    for c in pl.plan(schedules=["1f1b", "zb_h1"], verify=False, verify_top=6).candidates:
        assert c.schedules in (("1f1b",), ("zb_h1",), ("1f1b", "zb_h1"))
        for s in c.schedules:
            assert not pl.simulate(c, s).over_capacity, (s, c.describe())


@pytest.mark.parametrize("schedule,m", [("1f1b", 8), ("gpipe", 8), ("zb_h1", 3), ("zb_h1", 8), ("zb_h2", 8),
                                        ("zb_1p", 3), ("zb_1p", 8)])
def test_the_planner_sizes_each_stage_of_a_split_at_the_peak_the_run_will_hold(schedule, m):
    """Without full recomputation a microbatch waiting for its W keeps its stash: ZB-H1 holds
    min(p, m) on every stage, ZB-H2 2p - 1, zb_1p its limit p or the m there are, 1F1B
    min(p - k, m), GPipe all m; the engine's per-stage peak is what the split is sized at."""
    pl = Planner3D(TINY, (Pool("a10g", nodes=4, gpus_per_node=1),), global_batch=m)
    plan = pl.plan(schedules=[schedule], dp=1, verify=False).best
    assert len(plan.stages) == 4
    run = hops.simulate(pl.scenario(plan, schedule)).summary
    pos = ["first", "mid", "mid", "last"]
    held = [pl.held(pl.memory_key(schedule), pl.table(*st), n, ps, i, 4, m)
            for i, (st, n, ps) in enumerate(zip(plan.stages, plan.layers, pos))]
    assert held == run["peak_in_flight"]


def test_only_schedules_that_hold_more_than_1f1b_leave_its_level():
    pl = Planner3D(TINY, POOLS, global_batch=8)
    assert [pl.memory_key(s) for s in ("1f1b", "interleaved_1f1b", "hetero_search")] == [None] * 3
    assert [pl.memory_key(s) for s in ("gpipe", "zb_h1", "zb_h2", "zb_1p", "zb_auto")] == [
        "gpipe", "zb_h1", "zb_h2", "zb_1p", "zb_auto"]


# eight A10Gs, a model that barely fits: at 1F1B's level DP 2 x PP 4 [7,8,8,7] looks best for
# ZB-H1, but ZB-H1 holds p microbatches on its middle stages too and overruns them
SEQ8K = {"layers": 30, "hidden_dim": 2048, "heads": 16, "seq_len": 8192, "vocab_size": 32000}
A10GS8 = (Pool("a10g", nodes=8, gpus_per_node=1),)


def test_without_full_recomputation_a_zb_h1_split_is_sized_at_zb_h1s_peak_and_its_best_plan_fits():
    """Sized at ZB-H1's own order, the estimate is the simulated peak of every verified plan, and
    the one plan verified fits (1F1B's level put the top estimate over capacity)."""
    pl = Planner3D(SEQ8K, A10GS8, global_batch=16)
    for c in pl.plan(schedules=["zb_h1"], verify=False).candidates:
        run = pl.simulate(c, "zb_h1")
        assert not run.over_capacity, c.describe()
        assert c.memory_mb == pytest.approx(run.memory_mb, rel=1e-9)
    assert not pl.plan(schedules=["zb_h1"], verify_top=1).best.over_capacity


@pytest.mark.parametrize("top", ["0", "-1", "three"])
def test_top_must_be_a_positive_number_of_plans(tmp_path, capsys, top):
    from hops.plan import main

    with pytest.raises(SystemExit) as exc:
        main([str(request_file(tmp_path, schedules=["1f1b"])), "--top", top])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        "hops plan: error: argument --top: expected an integer >= 1, got")
