"""Training stacks and hosts are inputs, each preset checked against the formula it stands for.

GPU presets carry spec-sheet physics only; the fixtures' cluster facts (NIC caps, launch costs,
dispatch floors, unfused attention) live in the `fixture_megatron` stack and the `aws_*` hosts,
which the calibration variants name explicitly.
"""
import copy

import pytest

import hops
from hops.errors import HopsError
from hops.model.hardware import Catalog, CatalogError, Topology, per_gpu
from hops.provenance import model_fingerprint
from hops.scenario import load_scenario

GPU_PHYSICS = {"peak_tflops", "peak_tflops_tf32", "peak_tflops_fp32", "memory_bandwidth_gbps",
               "memory_gb", "l2_cache_mb", "mtbf_hours"}
OPTIONAL_GPU_FACTS = {"precisions", "peak_tflops_fp8"}  # where a GPU lacks one of bf16, fp16, fp32; where it has FP8


def test_gpu_presets_carry_gpu_physics_all_of_it_and_nothing_else():
    for name, preset in Catalog.load().devices.items():
        assert set(preset) - OPTIONAL_GPU_FACTS == GPU_PHYSICS, name  # each one whole: an fp32 run reads both rates


def test_a_stack_never_repeats_a_model_constant():
    cat = Catalog.load()
    for name, stack in cat.stacks.items():
        assert not set(stack) & set(cat.model), name


def arch_doc(stack, *, seq=2048, layers=2, gpu="h100_sxm", hidden=1024, heads=16):
    """Three stages of `layers` layers: the middle one has neither embedding nor LM head."""
    return {"simulation": {"microbatches": 3, "batches": 1},
            "pipeline": {"stack": stack, "model": {"layers": 3 * layers, "hidden_dim": hidden, "heads": heads,
                                                   "seq_len": seq},
                         "stages": [{"device": f"g{i}", "layers": layers} for i in range(3)]},
            "hardware": {"devices": [{"id": f"g{i}", "gpu": gpu, "node": "n"} for i in range(3)],
                         "interconnect": {"same_node": "nvlink"}},
            "optimizer": {"enabled": False}}


def middle_forward(d, catalog=None):
    return hops.simulate(d, catalog=catalog).summary["stages"][1]["expected_ms"]["F"]


@pytest.mark.parametrize("seq", [1024, 4096])
def test_flash_attention_has_no_s2_hbm_term(seq):
    """Flash: GEMMs at the stack's efficiency, the element-wise traffic, and the attention core's
    causal half of 4 s^2 h at the kernel's own efficiency, nothing per score in HBM."""
    cat = Catalog.load()
    m, dev = cat.constants("megatron_core"), cat.devices["h100_sxm"]
    h, L, peak, bw = 4096, 2, dev["peak_tflops"], dev["memory_bandwidth_gbps"]
    params = 12 * h * h
    gemm = L * 2 * seq * params / (peak * 1e12) * 1000 * m["compute_time_coefficient"]
    mlp_handover_mb = 2 * seq * 4 * h * 2 / 2**20  # 64 MB at s 1024, 256 at 4096: over H100's 50 MB L2
    elementwise = L * 2 * 34 * seq * h / 1e6 / bw * (1 - dev["l2_cache_mb"] / mlp_handover_mb)
    core = L * 4 * seq * seq * h * m["flash_causal_flop_share"] / (peak * 1e12) * 1000 / m["flash_efficiency_forward"]
    d = arch_doc("megatron_core", seq=seq, hidden=h, heads=32)
    assert middle_forward(d) == pytest.approx(gemm + elementwise + core, rel=1e-9)


@pytest.mark.parametrize("seq", [1024, 4096])
def test_unfused_attention_pays_bytes_per_score_in_hbm(seq):
    """Unfused (the fixtures' stack): the core is GEMMs, and the heads x s^2 scores' forward passes
    reach HBM for the share of the layer's score footprint (bf16 scores + the 5 B stash) that L2
    cannot hold, at attention_bytes_forward each; the element-wise traffic for the share of the MLP's
    hand-over (two 4h-wide bf16 tensors per token) that L2 cannot hold. The floor overlaps the
    kernels, the launch adds."""
    cat = Catalog.load()
    m, dev = cat.constants("fixture_megatron"), cat.devices["h100_sxm"]
    h, L, peak, bw = 1024, 2, dev["peak_tflops"], dev["memory_bandwidth_gbps"]
    gemm = L * (24 * seq * h * h + 4 * seq * seq * h) / (peak * 1e12) * 1000 * m["compute_time_coefficient"]
    mlp_handover_mb = 2 * seq * 4 * h * 2 / 2**20  # 16 MB at s 1024 (fits: no wait), 64 at 4096
    elementwise = L * 2 * 34 * seq * h / 1e6 / bw * max(0, 1 - dev["l2_cache_mb"] / mlp_handover_mb)
    footprint_mb = 16 * seq * seq * (2 + 5) / 2**20  # 112 MB at s 1024, 1792 MB at 4096: over H100's 50 MB
    miss = 1 - dev["l2_cache_mb"] / footprint_mb
    scores = L * 16 * seq * seq * m["attention_bytes_forward"] * miss / 1e6 / bw
    floor = L * per_gpu(m, "k_floor_ms", "h100_sxm")
    expected = max(gemm + elementwise + scores, floor) + per_gpu(m, "launch_overhead_ms", "h100_sxm")
    assert middle_forward(arch_doc("fixture_megatron", seq=seq)) == pytest.approx(expected, rel=1e-9)


def stage_times(d, catalog=None):
    return hops.simulate(d, catalog=catalog).summary["stages"][1]["expected_ms"]


def test_a_forward_whose_handovers_fit_in_l2_waits_on_no_hbm_traffic():
    """Scores (8 x 512^2 x 7 B = 14 MB per layer) and the MLP's hand-over (2 x 512 x 4h x 2 B = 32 MB)
    both fit in L4's 48 MB: the forward is its GEMMs (h 4096 puts them above the dispatch floor) and
    the launch, whatever attention_bytes_forward says; its stash is written back behind the GEMMs."""
    cat = Catalog.load()
    m, dev = cat.constants("fixture_megatron"), cat.devices["l4"]
    h, s, L = 4096, 512, 2
    gemm = L * (24 * s * h * h + 4 * s * s * h) / (dev["peak_tflops"] * 1e12) * 1000 * m["compute_time_coefficient"]
    d = arch_doc("fixture_megatron", seq=s, heads=8, hidden=h, gpu="l4")
    assert middle_forward(d) == pytest.approx(gemm + per_gpu(m, "launch_overhead_ms", "l4"), rel=1e-9)
    hotter = Catalog.load({"stacks.fixture_megatron.attention_bytes_forward": 40.0})
    assert middle_forward(d, catalog=hotter) == pytest.approx(middle_forward(d), rel=1e-12)


def test_what_l2_cannot_hold_the_forward_waits_on_and_the_backward_reads_the_stash_whatever_l2_holds():
    """Halving L2 below both footprints: the forward pays the missing share of its score passes and of
    its element-wise traffic; the backward pays the missing share of its score passes beyond the 5 B
    stash it reads back from HBM in any case, and its element-wise traffic does not depend on L2."""
    cat = Catalog.load()
    m, bw = cat.constants("fixture_megatron"), cat.devices["l4"]["memory_bandwidth_gbps"]
    d = arch_doc("fixture_megatron", seq=512, heads=8, hidden=4096, gpu="l4")
    wide, narrow = stage_times(d), stage_times(d, Catalog.load({"devices.l4.l2_cache_mb": 7.0}))
    scores = 2 * 8 * 512 ** 2
    score_miss, mlp_miss = 1 - 7.0 / 14, 1 - 7.0 / 32  # footprints 14 MB and 32 MB
    elementwise = 2 * 2 * 34 * 512 * 4096 / 1e6 / bw
    forward = scores * m["attention_bytes_forward"] * score_miss / 1e6 / bw + elementwise * mlp_miss
    assert narrow["F"] - wide["F"] == pytest.approx(forward, rel=1e-9)
    backward = scores * (m["attention_bytes_backward"] - 5) * score_miss / 1e6 / bw
    assert narrow["BW"] - wide["BW"] == pytest.approx(backward, rel=1e-9)


@pytest.mark.parametrize("stack", ["megatron_core", "fixture_megatron"])
def test_full_recomputation_reruns_the_whole_forward_before_the_input_gradient(stack):
    """--recompute-granularity full: B (and the fused backward) first reruns the layer's forward,
    its GEMMs, attention core and element-wise passes alike, so each grows by exactly one forward;
    W only forms weight gradients and does not move. A big layer keeps the GPU work above the
    dispatch floor, so the difference is the forward's GPU time under either dispatch."""
    d = arch_doc(stack, seq=4096, hidden=4096, heads=32)
    plain = stage_times(d)
    full = stage_times(d, Catalog.load({f"stacks.{stack}.recompute": "full"}))
    forward_gpu = plain["F"] - (per_gpu(Catalog.load().stacks[stack], "launch_overhead_ms", "h100_sxm")
                                if stack == "fixture_megatron" else 0.0)
    assert full["B"] - plain["B"] == pytest.approx(forward_gpu, rel=1e-9)
    assert full["BW"] - plain["BW"] == pytest.approx(forward_gpu, rel=1e-9)
    assert full["W"] == pytest.approx(plain["W"], rel=1e-12)


def test_selective_recomputation_reruns_the_attention_core_its_gemms_and_its_score_passes():
    """--recompute-granularity selective (Korthikanti et al. 2022, sec. 5) reruns each layer's
    attention core in its backward: under unfused attention that is the core's two batched GEMMs,
    Q K^T and scores x V (4 s^2 h FLOPs at the stack's GEMM efficiency), and the forward's score
    passes that miss L2 (heads x s^2 x attention_bytes_forward). B and the fused backward grow by
    exactly that; W does not move. h 4096, s 4096 keep the work above the dispatch floor."""
    cat = Catalog.load()
    m, dev = cat.constants("fixture_megatron"), cat.devices["h100_sxm"]
    s, h, heads, L = 4096, 4096, 32, 2
    d = arch_doc("fixture_megatron", seq=s, hidden=h, heads=heads)
    plain = stage_times(d)
    selective = stage_times(d, Catalog.load({"stacks.fixture_megatron.recompute": "selective"}))
    core = L * 4 * s * s * h / (dev["peak_tflops"] * 1e12) * 1000 * m["compute_time_coefficient"]
    miss = 1 - dev["l2_cache_mb"] / (heads * s * s * (2 + 5) / 2**20)
    passes = L * heads * s * s * m["attention_bytes_forward"] * miss / 1e6 / dev["memory_bandwidth_gbps"]
    assert selective["B"] - plain["B"] == pytest.approx(core + passes, rel=1e-9)
    assert selective["BW"] - plain["BW"] == pytest.approx(core + passes, rel=1e-9)
    assert selective["W"] == pytest.approx(plain["W"], rel=1e-12)


def test_under_flash_attention_the_weight_gemms_split_evenly_and_the_kernels_backward_is_b():
    """A weight GEMM's backward is its input gradient (B) and its weight gradient (W), each the
    forward's FLOPs again; the attention core has no weights, so its whole backward is B
    (hops/model/backward_split.py). The element-wise backward (norms, activation, dropout) forms
    activation gradients: B's too. A flash kernel runs the core apart from the GEMMs, so W is
    exactly the GEMMs' forward time, and B - W is the kernel's backward (2.5 x its causal forward
    FLOPs at its backward efficiency) plus the element-wise backward (2 x 2 x 34 s h bytes per
    layer over HBM, read whatever L2 holds)."""
    cat = Catalog.load()
    m, dev = cat.constants("megatron_core"), cat.devices["h100_sxm"]
    s, h, L, peak = 4096, 4096, 2, cat.devices["h100_sxm"]["peak_tflops"] * 1e12
    t = stage_times(arch_doc("megatron_core", seq=s, hidden=h, heads=32))
    gemm = L * 2 * s * 12 * h * h / peak * 1000 * m["compute_time_coefficient"]
    elementwise = L * 2 * 34 * s * h / 1e6 / dev["memory_bandwidth_gbps"]
    kernel_b = (L * 4 * s * s * h * m["flash_causal_flop_share"] * m["flash_backward_flop_factor"] / peak * 1000
                / m["flash_efficiency_backward"])
    assert t["W"] == pytest.approx(gemm, rel=1e-9)
    assert t["B"] - t["W"] == pytest.approx(kernel_b + 2 * elementwise, rel=1e-9)
    assert t["B"] + t["W"] == pytest.approx(t["BW"], rel=1e-9)


@pytest.mark.parametrize("stack", ["megatron_core", "fixture_megatron"])
def test_the_lm_heads_backward_splits_in_halves_whatever_the_layers_share(stack):
    """The LM head is one GEMM with weights: its input gradient (B) and its weight gradient (W) each
    cost its forward again. So the last stage's W exceeds a middle stage's by exactly half the
    head's fused backward, also under unfused attention at s 4096, where the layers' own share
    (3h + s)/(6h + s) = 0.54 would hand B more. The loss's logits passes are B's alone."""
    cat = Catalog.load()
    m, dev = cat.constants(stack), cat.devices["h100_sxm"]
    s, h, V = 4096, 4096, m["vocab_size"]
    head = 2 * s * h * V / (dev["peak_tflops"] * 1e12) * 1000 * m["compute_time_coefficient"] \
        + h * V * 2 / 1e6 / dev["memory_bandwidth_gbps"]
    d = arch_doc(stack, seq=s, hidden=h, heads=32)
    d["pipeline"]["model"]["vocab_size"] = V
    stages = hops.simulate(d).summary["stages"]
    middle, last = stages[1]["expected_ms"], stages[2]["expected_ms"]
    assert last["W"] - middle["W"] == pytest.approx(head, rel=1e-9)  # half of the backward's 2 x head


def test_async_dispatch_hides_the_host_behind_longer_gpu_work_and_shows_when_it_is_shorter():
    cat = Catalog.load()
    m = cat.constants("megatron_core")
    host = 2 * per_gpu(m, "k_floor_ms", "h100_sxm") + per_gpu(m, "launch_overhead_ms", "h100_sxm")
    tiny = middle_forward(arch_doc("megatron_core", seq=64, hidden=256, heads=4))
    assert tiny == pytest.approx(host)  # a tiny layer: the host's dispatch sets the pace
    big = arch_doc("megatron_core", seq=4096, hidden=4096, heads=32)
    slow_host = Catalog.load(["stacks.megatron_core.k_floor_ms.default=0.5"])
    assert middle_forward(big, slow_host) == middle_forward(big) > host  # ... a big one hides it


def test_the_fixture_stack_adds_the_launch_to_the_kernels():
    slower = Catalog.load(["stacks.fixture_megatron.launch_overhead_ms.h100=0.5"])
    d = arch_doc("fixture_megatron", seq=4096, hidden=4096, heads=32, gpu="h100")
    base = Catalog.load()
    launch = per_gpu(base.stacks["fixture_megatron"], "launch_overhead_ms", "h100")
    assert middle_forward(d, slower) - middle_forward(d, base) == pytest.approx(0.5 - launch)


def two_nodes(host=None, cross="infiniband"):
    d = arch_doc("megatron_core")
    d["hardware"] = {"devices": [{"id": f"g{i}", "gpu": "h100_sxm", "node": f"n{i}"} for i in range(3)],
                     "interconnect": {"cross_node": cross}}
    if host:
        d["hardware"]["host"] = host
    return d


@pytest.mark.parametrize("mb", [1.0, 256.0])
def test_infiniband_without_a_host_is_ndr_per_gpu_latency_plus_bytes_over_bandwidth(mb):
    cat = Catalog.load()
    link = Topology(load_scenario(two_nodes()), cat).link("g0", "g1")
    ib = cat.interconnects["infiniband"]
    assert ib["bandwidth_gbps"] == 50  # NDR 400 Gb/s
    assert link.transfer_ms(mb) == pytest.approx(ib["latency_ms"] + mb / 50.0)


def test_a_hosts_nic_caps_its_cross_node_links_and_the_fixture_cap_is_the_p5_hosts():
    cat = Catalog.load()
    capped = Topology(load_scenario(two_nodes("aws_p5")), cat).link("g0", "g1")
    assert capped.bandwidth_gbps == cat.hosts["aws_p5"]["host_network_gbps"] == 3.44
    over = Catalog.load(["hosts.aws_p5.host_network_gbps=10"])
    assert Topology(load_scenario(two_nodes("aws_p5"), over), over).link("g0", "g1").bandwidth_gbps == 10


def test_a_hosts_gpu_link_joins_its_gpus_when_the_scenario_names_none():
    d = arch_doc("megatron_core")
    d["hardware"] = {"host": "dgx_h100", "devices": [{"id": f"g{i}", "gpu": "h100_sxm", "node": "n"}
                                                    for i in range(3)]}
    link = Topology(load_scenario(d), Catalog.load()).link("g0", "g1")
    assert link.kind == "nvlink" and link.bandwidth_gbps == 450


def test_stack_and_host_overrides_move_the_fingerprint():
    base = model_fingerprint()
    assert model_fingerprint(["stacks.megatron_core.compute_time_coefficient=1.5"]) != base
    assert model_fingerprint(["hosts.aws_g5.host_network_gbps=2"]) != base
    assert model_fingerprint(["stacks.fixture_megatron.k_floor_ms.l4=1.2"]) != base


@pytest.mark.parametrize("override,needle", [
    ("stacks.megatron_core.attention=fused", "stacks.megatron_core.attention: got 'fused'; expected one of unfused, "
                                             "flash"),
    ("stacks.fixture_megatron.attention=flash", "stacks.fixture_megatron.flash_efficiency_forward: missing"),
    ("stacks.megatron_core.no_such=1", "unknown key 'no_such'"),
    ("hosts.dgx_h100.gpu_link=nvlink9", "hosts.dgx_h100.gpu_link: got 'nvlink9'; expected an interconnect preset"),
])
def test_a_bad_stack_override_is_one_line_naming_the_path(override, needle):
    with pytest.raises(CatalogError) as exc:
        Catalog.load([override])
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_the_calibration_variants_name_the_fixture_stack_and_hosts(fixtures_root):
    from autoresearch.fixtures import Fixture
    from autoresearch.variants import spec_scenario

    path = fixtures_root / "train" / "cluster_results" / "exp2_1_all_nodes_run93"
    doc = spec_scenario(Fixture(path.name, "train", path))
    assert doc["pipeline"]["stack"] == "fixture_megatron"
    hosts = {d["gpu"]: d["host"] for d in doc["hardware"]["devices"]}
    assert hosts == {"h100": "aws_p5", "a10g": "aws_g5", "l4": "aws_g6"}
    raw = copy.deepcopy(Fixture(path.name, "train", path).scenario_doc)
    assert load_scenario(raw).stack == "megatron_core"  # as-is it loads, as a user scenario


@pytest.mark.parametrize("fid, s, h, declared", [
    ("exp2_33_all_nodes_seq4096_run197", 4096, 1024, 0.24),  # 2 layers at 28 s h^2 (0.2405, rounded)
    ("exp2_34_all_nodes_hidden2048_run201", 1024, 2048, 0.24),
    ("exp2_1_all_nodes_run93", 1024, 1024, 0.06),  # s = h: 28 s h^2 is exact
])
def test_the_calibration_variants_charge_the_layers_the_scenario_encodes_their_true_flops(fixtures_root, fid, s, h,
                                                                                            declared):
    from autoresearch.fixtures import Fixture
    from autoresearch.variants import spec_scenario

    path = fixtures_root / "train" / "cluster_results" / fid
    doc = spec_scenario(Fixture(path.name, "train", path))
    layers = declared * 1e12 / (28 * s * h * h)  # the layer count the declared FLOPs encode
    assert layers == pytest.approx(2.0, rel=0.01)
    for st in doc["pipeline"]["stages"]:
        assert st["layers"] == pytest.approx(layers)
        # a GPT layer's forward: 24 s h^2 in the linear layers + 4 s^2 h in the attention core
        assert st["compute"]["tflop"] == pytest.approx(layers * (24 * s * h * h + 4 * s * s * h) / 1e12)
        assert st["compute"]["tflop"] / declared == pytest.approx((24 + 4 * s / h) / 28)
    assert [st.layers for st in load_scenario(doc).stages] == pytest.approx([layers] * 6)


def test_unknown_stack_and_host_names_are_one_line_errors():
    d = arch_doc("tensorrt")
    with pytest.raises(HopsError, match=r"^pipeline.stack: got 'tensorrt'; expected one of fixture_megatron, "
                                        r"megatron_core$"):
        load_scenario(d)


@pytest.mark.parametrize("switch,value", [("recompute", "full"), ("sequence_parallel", True),
                                          ("dispatch", "sync_launch"), ("p2p_overlap", True)])
def test_a_scenarios_stack_options_are_the_preset_with_that_switch_flipped(switch, value):
    """A run's flags (--recompute-granularity full, ...) belong in its scenario: setting one there
    predicts exactly what the preset with that switch overridden predicts."""
    d = arch_doc("megatron_core", layers=4)
    d["pipeline"]["stages"] = [{"devices": [f"g{2 * i}", f"g{2 * i + 1}"], "layers": 4} for i in range(3)]
    d["hardware"]["devices"] = [{"id": f"g{i}", "gpu": "h100_sxm", "node": "n"} for i in range(6)]
    d["optimizer"] = {"enabled": True}
    flipped = copy.deepcopy(d)
    flipped["pipeline"]["stack_options"] = {switch: value}
    preset = hops.simulate(d, catalog=Catalog.load([f"stacks.megatron_core.{switch}={value}"])).summary
    mine, plain = hops.simulate(flipped).summary, hops.simulate(d).summary
    for key in ("throughput", "peak_memory_mb", "stages"):
        assert mine[key] == preset[key], key
    assert (mine["throughput"], mine["peak_memory_mb"]) != (plain["throughput"], plain["peak_memory_mb"])


def test_null_stack_options_keep_the_presets_switches():
    d = arch_doc("fixture_megatron")
    nulls = copy.deepcopy(d)
    nulls["pipeline"]["stack_options"] = dict.fromkeys(("attention", "dispatch", "recompute", "p2p_overlap",
                                                        "tensor_parallel_overlap", "sequence_parallel",
                                                        "dp_overlap_grad_reduce"))
    assert load_scenario(nulls).stack_options == {}
    assert hops.simulate(nulls).summary["stages"] == hops.simulate(d).summary["stages"]


@pytest.mark.parametrize("options,message", [
    ({"attention": "unfused"}, "pipeline.stack_options.attention: stacks.megatron_core.attention_bytes_forward: "
                               "missing; unfused attention and dispatch need it (a catalog.stacks.megatron_core.* "
                               "override can add it, or pick a stack that has it)"),
    ({"recompute": "most"}, "pipeline.stack_options.recompute: got 'most'; expected one of none, selective, full"),
    ({"compute_time_coefficient": 1.0}, "pipeline.stack_options.compute_time_coefficient: unknown key"),
    ({"p2p_overlap": "yes"}, "pipeline.stack_options.p2p_overlap: got 'yes'; expected one of false, true, interleaved"),
    ({"p2p_overlap": 1}, "pipeline.stack_options.p2p_overlap: got 1; expected one of false, true, interleaved"),
])
def test_a_stack_option_the_preset_cannot_take_is_a_one_line_error_naming_the_field(options, message):
    d = arch_doc("megatron_core")
    d["pipeline"]["stack_options"] = options
    with pytest.raises(HopsError) as exc:
        load_scenario(d)
    assert str(exc.value).startswith(message) and "\n" not in str(exc.value)


@pytest.mark.parametrize("tf32,gpu_rate", [(False, "peak_tflops_fp32"), (True, "peak_tflops_tf32")])
def test_an_fp32_runs_gemms_at_the_gpus_fp32_rate_or_with_tf32_matmul_at_its_tf32_rate(tf32, gpu_rate):
    """bf16 GEMMs run on the tensor cores at peak_tflops; an fp32 run's at the FP32 units' rate
    (PyTorch's default) or, with allow_tf32, at the TF32 tensor rate. On a GEMM-bound stage
    (h 8192, s 512) the forward scales by the rates' ratio, up to the element-wise traffic that
    fp32 doubles."""
    gpu = Catalog.load().devices["h100_sxm"]
    bf16 = arch_doc("megatron_core", seq=512, hidden=8192, heads=64)
    fp32 = copy.deepcopy(bf16)
    fp32["pipeline"].update(precision="fp32", stack_options={"tf32_matmul": tf32})
    assert middle_forward(fp32) / middle_forward(bf16) == pytest.approx(gpu["peak_tflops"] / gpu[gpu_rate], rel=0.03)


def test_tf32_matmul_leaves_a_bf16_run_alone():
    bf16 = arch_doc("megatron_core", seq=512, hidden=8192, heads=64)
    tf32 = copy.deepcopy(bf16)
    tf32["pipeline"]["stack_options"] = {"tf32_matmul": True}
    assert middle_forward(tf32) == middle_forward(bf16)


@pytest.mark.parametrize("tp", [2, 4])
def test_sequence_parallel_ranks_send_their_shard_of_the_activation(tp):
    """Without sequence parallelism each tensor-parallel rank sends the whole s x b x h activation
    over its own link; with it, its 1/t shard: latency + (s b h x 2 B / t) / bandwidth."""
    d = arch_doc("megatron_core")
    d["pipeline"]["stages"] = [{"devices": [f"g{tp * i + j}" for j in range(tp)], "layers": 2} for i in range(3)]
    d["hardware"]["devices"] = [{"id": f"g{i}", "gpu": "h100_sxm", "node": f"n{i // tp}"} for i in range(3 * tp)]
    d["hardware"]["interconnect"] = {"same_node": "nvlink", "cross_node": "infiniband"}
    catalog = Catalog.load({"interconnects.infiniband.jitter": 0})
    ib = catalog.interconnects["infiniband"]
    full_mb = 2048 * 1024 * 2 / 1e6
    for sp, shard in ((False, 1), (True, tp)):
        d["pipeline"]["stack_options"] = {"sequence_parallel": sp}
        tl = hops.simulate(d, catalog=catalog).timeline
        hops_ms = (tl.end_ms - tl.start_ms)[tl.kind == "transfer"]
        assert hops_ms == pytest.approx(ib["latency_ms"] + full_mb / shard / ib["bandwidth_gbps"], rel=1e-6)


def test_a_bf16_run_on_a_gpu_without_bf16_tensor_cores_is_a_one_line_error():
    d = arch_doc("megatron_core", gpu="v100")
    with pytest.raises(HopsError) as exc:
        load_scenario(d)
    assert str(exc.value) == ("pipeline.precision: got 'bf16'; hardware.devices[0] (v100) has no bf16 tensor cores: "
                              "expected one of fp16, fp32")


def test_volta_runs_fp16_at_its_tensor_rate_and_fp32_without_tf32_whatever_allow_tf32_says():
    d = arch_doc("megatron_core", gpu="v100")
    d["pipeline"]["precision"] = "fp16"
    assert middle_forward(d) > 0
    d["pipeline"]["precision"] = "fp32"
    off, on = copy.deepcopy(d), copy.deepcopy(d)
    off["pipeline"]["stack_options"], on["pipeline"]["stack_options"] = {"tf32_matmul": False}, {"tf32_matmul": True}
    assert middle_forward(on) == middle_forward(off)


def test_an_fp8_run_speeds_up_the_layers_gemms_by_the_fp8_rate_and_nothing_else():
    """Transformer Engine's recipe: the transformer layers' GEMMs at the FP8 tensor rate; the
    attention core, the element-wise kernels and the bytes moved stay bf16. So on a middle stage
    the forward shrinks by exactly its linear GEMMs' time x (1 - bf16 rate / fp8 rate)."""
    cat = Catalog.load()
    gpu, m = cat.devices["h100_sxm"], cat.constants("megatron_core")
    h, s, layers = 8192, 512, 2
    bf16 = arch_doc("megatron_core", seq=s, hidden=h, heads=64, layers=layers)
    fp8 = copy.deepcopy(bf16)
    fp8["pipeline"]["precision"] = "fp8"
    gemm_bf16 = layers * 2 * s * 12 * h * h / (gpu["peak_tflops"] * 1e12) * 1000 * m["compute_time_coefficient"]
    saved = gemm_bf16 * (1 - gpu["peak_tflops"] / gpu["peak_tflops_fp8"])
    assert middle_forward(bf16) - middle_forward(fp8) == pytest.approx(saved, rel=1e-9)
    assert hops.simulate(fp8).summary["peak_memory_mb"] == hops.simulate(bf16).summary["peak_memory_mb"]


@pytest.mark.parametrize("gpu,runs", [("a100", "bf16, fp16, fp32"), ("v100", "fp16, fp32")])
def test_an_fp8_run_on_a_gpu_without_fp8_tensor_cores_is_a_one_line_error(gpu, runs):
    d = arch_doc("megatron_core", gpu=gpu)
    d["pipeline"]["precision"] = "fp8"
    with pytest.raises(HopsError) as exc:
        load_scenario(d)
    assert str(exc.value) == (f"pipeline.precision: got 'fp8'; hardware.devices[0] ({gpu}) has no fp8 tensor cores: "
                              f"expected one of {runs}")


def test_a_preset_switch_outside_its_choices_is_a_one_line_error_listing_them():
    with pytest.raises(CatalogError) as exc:
        Catalog.load({"stacks.megatron_core.p2p_overlap": "maybe"})
    assert str(exc.value) == "stacks.megatron_core.p2p_overlap: got 'maybe'; expected one of false, true, interleaved"
