"""Tensor-parallel stages and data-parallel replicas, each checked against its published formula.

A stage given `devices: [ids]` is a Megatron tensor-parallel group (Shoeybi et al. 2019;
Korthikanti et al. 2022): its GEMMs, heads and weights split t ways, every layer adds two
reductions of the b x s x h activation per pass on the node's links, and each GPU stashes
s b h (10 + 24/t + 5as/(ht)) bytes per layer. Data-parallel replicas reduce each stage's
gradients in a ring (or reduce-scatter + all-gather when the optimizer state is sharded).
"""
import copy

import pytest

import hops
from hops.model.architecture import Architecture
from hops.model.collectives import ring_allreduce_ms, ring_half_ms
from hops.errors import ScenarioError
from hops.model.hardware import Catalog
from hops.model.memory import layer_activation_bytes
from hops.scenario import load_scenario

H100 = "h100_sxm"


def groups_doc(tp, *, stages=3, layers_per_stage=2, hidden=4096, heads=32, seq=2048, mbs=1, stack="megatron_core",
               gpu=H100, host="dgx_h100", microbatches=4, optimizer=False, dp=None):
    """`stages` stages, each a group of `tp` GPUs of its own node (`device:` when tp is 1)."""
    devices, stage_list = [], []
    for i in range(stages):
        ids = [f"n{i}g{k}" for k in range(tp)]
        devices += [{"id": d, "gpu": gpu, "node": f"n{i}"} for d in ids]
        where = {"devices": ids} if tp > 1 else {"device": ids[0]}
        stage_list.append({**where, "layers": layers_per_stage})
    doc = {"simulation": {"microbatches": microbatches, "batches": 2, "micro_batch_size": mbs},
           "pipeline": {"schedule": "1f1b", "stack": stack,
                        "model": {"layers": stages * layers_per_stage, "hidden_dim": hidden, "heads": heads,
                                  "seq_len": seq, "vocab_size": 32000},
                        "stages": stage_list},
           "hardware": {"host": host, "devices": devices, "interconnect": {"cross_node": "infiniband"}},
           "optimizer": {"enabled": optimizer}}
    if dp is not None:
        doc["optimizer"]["data_parallel"] = dp
    return doc


def catalog(l2_cache_mb=None, **stack):
    """The presets with `stack` values; `l2_cache_mb` replaces the H100's L2 (0: not modelled)."""
    over = {f"stacks.megatron_core.{k}": v for k, v in stack.items()}
    if l2_cache_mb is not None:
        over[f"devices.{H100}.l2_cache_mb"] = l2_cache_mb
    return Catalog.load(over)


def expected(doc, cat=None):
    return hops.simulate(doc, catalog=cat).summary["stages"]


def allreduce_ms(hidden, seq, mbs, t, link="nvlink"):
    ic = Catalog.load().interconnects[link]
    return ring_allreduce_ms(mbs * seq * hidden * 2 / 1e6, t, ic["bandwidth_gbps"], ic["latency_ms"])


# ----------------------------------------------------------------------------- compute and collectives
@pytest.mark.parametrize("t", [2, 4, 8])
def test_tp_k_on_a_compute_bound_layer_gives_a_kth_of_the_compute_plus_the_ring_all_reduces(t):
    """Sequence parallelism splits every kernel t ways, so a middle stage's forward is exactly the
    single GPU's / t plus 2 reductions per layer at 2(t-1)/t x bytes / bandwidth + 2(t-1) latencies.
    L2 is left out: a rank's t-th of the MLP's hand-over fits in L2 sooner than the whole one, so
    with it the forward's element-wise share shrinks faster than 1/t (hops/model/compute.py)."""
    cat = catalog(l2_cache_mb=0, sequence_parallel=True, tensor_parallel_overlap="none")
    one = expected(groups_doc(1), cat)[1]["expected_ms"]
    group = expected(groups_doc(t), cat)[1]
    comm = 2 * 2 * allreduce_ms(4096, 2048, 1, t)  # 2 layers x 2 all-reduces
    assert comm == pytest.approx(2 * 2 * (2 * (t - 1) / t * 2048 * 4096 * 2 / 1e6 / 450 + 2 * (t - 1) * 0.005))
    assert group["expected_ms"]["F"] == pytest.approx(one["F"] / t + comm, rel=1e-9)
    assert group["expected_ms"]["BW"] == pytest.approx(one["BW"] / t + comm, rel=1e-9)
    assert group["tensor_parallel"]["exposed_collective_ms"]["F"] == pytest.approx(comm)


def test_without_sequence_parallelism_the_norms_and_dropouts_stay_whole_on_every_rank():
    """The element-wise traffic follows the stash: 10 s b h of the 34 is not split (Korthikanti sec. 4.2.1).
    (L2 left out, as above: the forward's element-wise share that waits on HBM is the test's subject.)"""
    cat = catalog(l2_cache_mb=0, tensor_parallel_overlap="none")
    arch = load_scenario(groups_doc(4), cat).architecture
    assert arch.activation_bytes(4) == pytest.approx(2048 * 4096 * (10 + 24 / 4))
    one = expected(groups_doc(1), cat)[1]["expected_ms"]["F"]
    four = expected(groups_doc(4), cat)[1]["expected_ms"]["F"]
    sp = expected(groups_doc(4), catalog(l2_cache_mb=0, tensor_parallel_overlap="none", sequence_parallel=True))[1]
    m, dev = cat.constants("megatron_core"), cat.devices[H100]
    elementwise_1 = 2 * 2 * 34 * 2048 * 4096 / 1e6 / dev["memory_bandwidth_gbps"]
    elementwise_4 = 2 * 2 * (10 + 6) * 2048 * 4096 / 1e6 / dev["memory_bandwidth_gbps"]
    assert four - sp["expected_ms"]["F"] == pytest.approx(elementwise_4 - elementwise_1 / 4, rel=1e-6)
    assert four < one / 2


def test_the_stack_says_what_hides_the_backward_collectives():
    """`backward` (Megatron's async input-gradient all-reduce) hides them behind the column-parallel
    weight-gradient GEMMs of a fused backward, not in the forward nor in a split B; `all` hides both."""
    none = expected(groups_doc(8, hidden=8192, heads=64), catalog(tensor_parallel_overlap="none"))[1]
    back = expected(groups_doc(8, hidden=8192, heads=64), catalog(tensor_parallel_overlap="backward"))[1]
    both = expected(groups_doc(8, hidden=8192, heads=64), catalog(tensor_parallel_overlap="all"))[1]
    exp = lambda r, ph: r["tensor_parallel"]["exposed_collective_ms"][ph]
    assert exp(back, "F") == exp(none, "F") > 0 and exp(back, "B") == exp(none, "B")
    assert exp(back, "BW") < exp(none, "BW")
    assert back["expected_ms"]["BW"] == pytest.approx(none["expected_ms"]["BW"] - exp(none, "BW") + exp(back, "BW"))
    assert exp(both, "F") < exp(none, "F") and exp(both, "BW") <= exp(back, "BW")


def test_full_recomputation_reruns_the_layers_reductions_not_the_embeddings():
    """--recompute-granularity full checkpoints the transformer layers (Korthikanti et al. 2022,
    sec. 5): the backward reruns each layer's forward with its 2 all-reduces, so the first stage's
    backward carries 2 L of them twice; the vocabulary-parallel embedding's reduction runs once,
    in the forward, and is not recomputed."""
    doc = groups_doc(4)
    one = allreduce_ms(4096, 2048, 1, 4)
    layers = 2
    plain = expected(doc, catalog(tensor_parallel_overlap="none"))[0]["tensor_parallel"]["exposed_collective_ms"]
    full = expected(doc, catalog(tensor_parallel_overlap="none", recompute="full"))[0]["tensor_parallel"][
        "exposed_collective_ms"]
    assert plain["F"] == full["F"] == pytest.approx(2 * layers * one + one)
    assert plain["BW"] == pytest.approx(2 * layers * one)
    assert full["BW"] == pytest.approx(2 * 2 * layers * one)


@pytest.mark.parametrize("t", [1, 4])
def test_tied_embeddings_are_all_reduced_per_rank_on_a_tth_of_the_vocabulary(t):
    """The vocabulary-parallel embedding gives each rank V / t rows; rank k of the first stage
    all-reduces its rows' gradients with rank k of the last, the t pairs at once over their own
    cross-node links: a two-rank ring of V h / t fp32 gradients."""
    doc = groups_doc(t)
    doc["pipeline"]["model"]["tied_embeddings"] = True
    tl = hops.simulate(doc).timeline
    sync = tl.select(tl.kind == "allreduce")
    ic = Catalog.load().interconnects["infiniband"]
    grad_mb = 32000 * 4096 * Catalog.load().model["embedding_grad_bytes_per_element"] / 1e6
    assert len(sync) > 0
    assert (sync.end_ms - sync.start_ms) == pytest.approx(
        [ring_allreduce_ms(grad_mb / t, 2, ic["bandwidth_gbps"], ic["latency_ms"])] * len(sync), rel=1e-9)


def test_the_timeline_and_the_trace_show_the_collectives_inside_their_pass(tmp_path):
    r = hops.simulate(groups_doc(4))
    tl = r.timeline
    coll = tl.kind == "collective"
    comp = tl.kind == "compute"
    assert coll.sum() == comp.sum() - (tl.phase[comp] == "W").sum()  # every F and B/BW leaves some exposed
    for s in range(3):
        c = coll & (tl.stage == s)
        assert (tl.device[c] == f"n{s}g0").all()
    # each collective row ends with a compute row of its stage and phase and lies inside it
    ends = {(int(s), str(ph), float(e)): float(b) for s, ph, b, e in
            zip(tl.stage[comp], tl.phase[comp], tl.start_ms[comp], tl.end_ms[comp])}
    for s, ph, b, e in zip(tl.stage[coll], tl.phase[coll], tl.start_ms[coll], tl.end_ms[coll]):
        assert ends[(int(s), str(ph), float(e))] <= b < e
    import json

    from hops.outputs.chrome_trace import write_chrome_trace
    from hops.outputs.plots import plot_timeline

    trace = json.loads(write_chrome_trace(tl, tmp_path / "trace.json").read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"TP collectives F", "TP collectives B"} <= names or {"TP collectives F", "TP collectives BW"} <= names
    assert plot_timeline(tl, tmp_path / "timeline.png").stat().st_size > 0


def test_collective_rows_are_not_busy_time_of_their_own():
    from hops.metrics import summarize

    tl = hops.simulate(groups_doc(4)).timeline
    with_rows, without = summarize(tl), summarize(tl.select(tl.kind != "collective"))
    assert with_rows["bubble_ratio"] == without["bubble_ratio"]


def test_a_device_stage_is_a_group_of_one():
    a, b = copy.deepcopy(groups_doc(1)), groups_doc(1)
    for st in b["pipeline"]["stages"]:
        st["devices"] = [st.pop("device")]
    ra, rb = hops.simulate(a), hops.simulate(b)
    assert ra.summary["stages"] == rb.summary["stages"]
    assert ra.summary["peak_memory_mb"] == rb.summary["peak_memory_mb"]


# ----------------------------------------------------------------------------- memory
GPT = Architecture(layers=24, hidden=2048, heads=16, kv_heads=16, ffn_dim=8192, ffn_gated=False, seq_len=2048,
                   vocab=50304, tied=True)


def korthikanti(s, b, h, a, t=1, sp=False, selective=False):
    """Korthikanti et al. 2022, Table 2: activation bytes per layer."""
    scores = 0 if selective else 5 * a * s / h
    if sp:
        return s * b * h / t * (34 + scores)
    return s * b * h * (10 + 24 / t + scores / t)


@pytest.mark.parametrize("t", [1, 2, 4, 8])
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_activation_memory_per_gpu_follows_megatrons_published_formula(t, sp, recompute):
    cat = Catalog.load({"stacks.fixture_megatron.sequence_parallel": sp,
                        "stacks.fixture_megatron.recompute": recompute})  # unfused attention: scores stashed
    doc = groups_doc(t, hidden=GPT.hidden, heads=GPT.heads, seq=GPT.seq_len, stack="fixture_megatron")
    sc = load_scenario(doc, cat)
    got = layer_activation_bytes(sc, cat, t)
    assert got == pytest.approx(korthikanti(GPT.seq_len, 1, GPT.hidden, GPT.heads, t, sp, recompute == "selective"))


@pytest.mark.parametrize("sp", [False, True])
def test_full_recomputation_stashes_the_layer_input_split_only_under_sequence_parallelism(sp):
    cat = Catalog.load({"stacks.fixture_megatron.sequence_parallel": sp, "stacks.fixture_megatron.recompute": "full"})
    sc = load_scenario(groups_doc(4, hidden=2048, heads=16, stack="fixture_megatron"), cat)
    assert layer_activation_bytes(sc, cat, 4) == pytest.approx(2 * 2048 * 2048 / (4 if sp else 1))


def test_each_gpu_of_a_group_holds_a_tth_of_the_weights_and_optimizer_state():
    one = hops.simulate(groups_doc(1, optimizer=True)).summary["peak_memory_mb"]
    four = hops.simulate(groups_doc(4, optimizer=True)).summary["peak_memory_mb"]
    assert set(four) == {f"n{i}g{k}" for i in range(3) for k in range(4)}
    assert four["n1g0"] == four["n1g3"]
    assert 0.2 < four["n1g0"] / one["n1g0"] < 0.3  # weights and state / 4, activations 10 + 24/4 of 34


# ----------------------------------------------------------------------------- the target
def test_7b_on_two_stages_of_four_h100_against_two_stages_of_one():
    """A 7B-shaped model (32 layers, h 4096, 32 heads, seq 4096) on 2 stages of 4x H100 (NVLink)
    against 2 stages of 1x H100: stage forward 0.25-0.5x, peak memory per GPU 0.2-0.5x."""
    kw = dict(stages=2, layers_per_stage=16, seq=4096, optimizer=True)
    one, four = hops.simulate(groups_doc(1, **kw)).summary, hops.simulate(groups_doc(4, **kw)).summary
    for s in range(2):
        ratio = four["stages"][s]["expected_ms"]["F"] / one["stages"][s]["expected_ms"]["F"]
        assert 0.25 <= ratio <= 0.5, (s, ratio)
        mem = four["peak_memory_mb"][f"n{s}g0"] / one["peak_memory_mb"][f"n{s}g0"]
        assert 0.2 <= mem <= 0.5, (s, mem)
    assert four["throughput"]["samples_per_s"] > 2 * one["throughput"]["samples_per_s"]


# ----------------------------------------------------------------------------- data parallelism
def dp_rows(doc, cat=None):
    tl = hops.simulate(doc, catalog=cat).timeline
    ar = (tl.kind == "allreduce") & (tl.iteration == 0)
    return dict(zip(tl.stage[ar].tolist(), (tl.end_ms - tl.start_ms)[ar].tolist()))


def stage_grads_mb(doc, s):
    sc = load_scenario(doc)
    st = sc.stages[s]
    return st.weights_mb / st.tp / 2 * 4  # fp32 main grads of one GPU's share


@pytest.mark.parametrize("tp,d", [(1, 2), (2, 4), (4, 8)])
def test_dp_ring_all_reduce_of_each_stages_gradients_over_the_host_network(tp, d):
    doc = groups_doc(tp, optimizer=True, dp={"degree": d})
    doc["pipeline"]["model"]["tied_embeddings"] = False  # no embedding sync on the same rows
    got = dp_rows(doc)
    for s in range(3):
        # replicas on other DGX H100 nodes: NDR 400 Gb/s per GPU, 50 GB/s, capped by the host's 50
        assert got[s] == pytest.approx(ring_allreduce_ms(stage_grads_mb(doc, s), d, 50.0, 0.005), rel=1e-9)
        assert got[s] == pytest.approx(2 * (d - 1) / d * stage_grads_mb(doc, s) / 50.0 + 2 * (d - 1) * 0.005)


@pytest.mark.parametrize("sharding", ["zero1", "fsdp"])
def test_sharded_optimizer_reduce_scatters_gradients_and_all_gathers_weights(sharding):
    d = 4
    doc = groups_doc(2, optimizer=True, dp={"degree": d, "sharding": sharding})
    doc["pipeline"]["model"]["tied_embeddings"] = False
    got = dp_rows(doc)
    for s in range(3):
        grads = stage_grads_mb(doc, s)
        want = ring_half_ms(grads, d, 50.0, 0.005) + ring_half_ms(grads / 2, d, 50.0, 0.005)  # bf16 weights
        assert got[s] == pytest.approx(want, rel=1e-9)
    plain = hops.simulate(groups_doc(2, optimizer=True, dp={"degree": d})).summary["peak_memory_mb"]
    sharded = hops.simulate(doc).summary["peak_memory_mb"]
    assert sharded["n1g0"] < plain["n1g0"]  # optimizer state / d


@pytest.mark.parametrize("tp,d,sharding,per_param", [(1, 1, "none", 18), (2, 1, "none", 18 / 2),
                                                     (1, 4, "zero1", 6 + 12 / 4), (2, 4, "zero1", (6 + 12 / 4) / 2)])
def test_each_parameter_holds_18_bytes_of_weight_grad_and_adam_state_or_6_plus_12_over_d_sharded(tp, d, sharding,
                                                                                                   per_param):
    """Megatron's mixed precision per parameter (Megatron-LM's distributed-optimizer notes): bf16
    weight 2 B, fp32 main grad 4 B, fp32 master weight, Adam m and v 12 B, 18 B in all; the
    distributed optimizer (ZeRO-1) shards the 12 over the d replicas, 6 + 12/d. ZeRO (Rajbhandari
    et al. 2020, sec. 3.1) counts the same 2 + 2 + 12 = 16 B with fp16 gradients. A tensor-parallel
    rank holds 1/t of all of it. No activations here (activation_memory_mb: 0): a middle stage's
    peak is its two layers' parameters x those bytes."""
    doc = groups_doc(tp, optimizer=True, dp={"degree": d, "sharding": sharding} if d > 1 else None)
    for st in doc["pipeline"]["stages"]:
        st["activation_memory_mb"] = 0.0
    params = 2 * 12 * 4096 ** 2  # a middle stage: 2 GPT layers of h 4096, no vocabulary matrix
    peak = hops.simulate(doc).summary["peak_memory_mb"]
    assert peak["n1g0"] == pytest.approx(params * per_param / 1e6, rel=1e-12)


@pytest.mark.parametrize("d,sharding,per_param", [(1, "none", 16), (4, "zero1", 8 + 8 / 4)])
def test_an_fp32_run_holds_no_master_copy_weight_grad_and_adams_moments_16_bytes(d, sharding, per_param):
    """Without mixed precision the fp32 weight is its own master: 4 B weight, 4 B gradient and
    Adam's fp32 m and v, 8 B (ZeRO's K = 12 less the 4 B master copy), 16 B per parameter; ZeRO-1
    shards the moments over the d replicas."""
    doc = groups_doc(1, optimizer=True, dp={"degree": d, "sharding": sharding} if d > 1 else None)
    doc["pipeline"]["precision"] = "fp32"
    for st in doc["pipeline"]["stages"]:
        st["activation_memory_mb"] = 0.0
    params = 2 * 12 * 4096 ** 2
    peak = hops.simulate(doc).summary["peak_memory_mb"]
    assert peak["n1g0"] == pytest.approx(params * per_param / 1e6, rel=1e-12)


def test_overlapped_grad_reduce_hides_behind_the_last_backward():
    doc = groups_doc(1, optimizer=True, dp={"degree": 8}, hidden=1024, heads=16, seq=8192)
    doc["pipeline"]["model"]["tied_embeddings"] = False
    cat = catalog(dp_overlap_grad_reduce=True)
    plain, hidden = dp_rows(doc), dp_rows(doc, cat)
    bw = hops.simulate(doc, catalog=cat).summary["stages"]
    for s in range(3):
        want = max(plain[s] - bw[s]["expected_ms"]["BW"], 0.0)
        assert hidden.get(s, 0.0) == pytest.approx(want)


# ----------------------------------------------------------------------------- bad input
def one_line_error(doc, field):
    with pytest.raises(ScenarioError) as exc:
        load_scenario(doc)
    msg = str(exc.value)
    assert "\n" not in msg and field in msg, msg
    return msg


def test_a_tp_group_spanning_nodes_is_refused():
    doc = groups_doc(4)
    doc["hardware"]["devices"][3]["node"] = "elsewhere"
    assert "spans nodes" in one_line_error(doc, "pipeline.stages[0].devices")


@pytest.mark.parametrize("layers", [2, "auto"])
def test_a_tp_group_without_a_link_between_its_gpus_is_refused_before_layers_are_planned(layers):
    doc = groups_doc(2)
    del doc["hardware"]["host"]  # no host preset: no NVLink between a node's GPUs unless same_node says so
    for st in doc["pipeline"]["stages"]:
        st["layers"] = layers
    assert "no link inside the tensor-parallel group" in one_line_error(doc, "pipeline.stages[0].devices")


def test_a_tp_group_mixing_gpu_types_is_refused():
    doc = groups_doc(4)
    doc["hardware"]["devices"][1]["gpu"] = "a100"
    assert "mixes GPU types" in one_line_error(doc, "pipeline.stages[0].devices")


def test_a_tp_size_that_does_not_divide_the_heads_is_refused():
    doc = groups_doc(4, heads=32)
    doc["pipeline"]["model"]["heads"] = 30
    doc["pipeline"]["model"]["hidden_dim"] = 30 * 128
    assert "does not divide pipeline.model.heads" in one_line_error(doc, "pipeline.stages[0].devices")


def test_a_gpu_in_two_groups_and_a_stage_with_both_device_and_devices_are_refused():
    doc = groups_doc(2)
    doc["pipeline"]["stages"][1]["devices"] = ["n0g1", "n1g1"]
    doc["hardware"]["devices"][3]["node"] = "n0"
    one_line_error(doc, "pipeline.stages[1].devices")
    doc = groups_doc(2)
    doc["pipeline"]["stages"][0]["device"] = "n0g0"
    one_line_error(doc, "pipeline.stages[0].devices")


def test_each_gpu_steps_its_share_of_the_optimizer_state():
    """The Adam step is HBM traffic per parameter: a GPU of a TP-t group steps 1/t of the stage,
    and under a sharded optimizer 1/d of that."""
    def step_ms(doc):
        tl = hops.simulate(doc).timeline
        opt = (tl.kind == "optimizer") & (tl.stage == 1) & (tl.iteration == 0)
        return float((tl.end_ms - tl.start_ms)[opt][0])

    fixed = Catalog.load().constants("megatron_core")["optimizer_step_fixed_ms"]
    one = step_ms(groups_doc(1, optimizer=True)) - fixed
    assert step_ms(groups_doc(4, optimizer=True)) - fixed == pytest.approx(one / 4)
    sharded = groups_doc(4, optimizer=True, dp={"degree": 2, "sharding": "zero1"})
    assert step_ms(sharded) - fixed == pytest.approx(one / 8)


def test_a_group_runs_at_its_slowest_gpus_pace():
    doc = groups_doc(4)
    base = hops.simulate(doc).timeline
    doc["failure"] = {"enabled": True, "stragglers": {"fixed": {"n1g2": 1.5}}}
    slow = hops.simulate(doc).timeline

    def f_ms(tl, s):
        sel = (tl.kind == "compute") & (tl.stage == s) & (tl.phase == "F")
        return (tl.end_ms - tl.start_ms)[sel]

    assert f_ms(slow, 1) == pytest.approx(1.5 * f_ms(base, 1))
    assert f_ms(slow, 0) == pytest.approx(f_ms(base, 0))


def test_replicas_without_a_link_are_refused_naming_the_field():
    doc = groups_doc(2, stages=1, optimizer=True, dp={"degree": 2})  # one DGX: no link between stages needed
    del doc["hardware"]["interconnect"]
    with pytest.raises(ScenarioError, match="^optimizer.data_parallel.interconnect: missing"):
        hops.simulate(doc)


@pytest.mark.parametrize("overlap,zb_wins", [("backward", False), ("all", True)])
def test_a_split_backward_exposes_the_reductions_the_fused_one_hides_behind_its_weight_gradients(overlap, zb_wins):
    """Megatron's default hides the input-gradient reductions behind the same layer's weight-gradient
    GEMMs; ZB's B runs without them, so under TP its B + W outlasts BW and ZB-H1 can lose to 1F1B
    (GPT-3 13B, PP 2 x TP 4, README). With --tp-comm-overlap nothing is exposed and ZB-H1 wins."""
    rate = {}
    for schedule in ("1f1b", "zb_h1"):
        doc = groups_doc(4, stages=2, layers_per_stage=20, hidden=5120, heads=40, microbatches=32, optimizer=True)
        doc["pipeline"]["schedule"] = schedule
        doc["pipeline"]["stack_options"] = {"tensor_parallel_overlap": overlap}
        summary = hops.simulate(doc).summary
        rate[schedule] = summary["throughput"]["samples_per_s"]
        e = summary["stages"][0]["expected_ms"]
        assert (e["B"] + e["W"] > e["BW"] + 1.0) == (overlap == "backward")
    assert (rate["zb_h1"] > rate["1f1b"]) == zb_wins
