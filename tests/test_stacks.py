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

GPU_PHYSICS = {"peak_tflops", "memory_bandwidth_gbps", "memory_gb", "mtbf_hours"}


def test_gpu_presets_keep_only_gpu_physics():
    for name, preset in Catalog.load().devices.items():
        assert set(preset) <= GPU_PHYSICS, name


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
    elementwise = L * 2 * 34 * seq * h / 1e6 / bw
    core = L * 4 * seq * seq * h * m["flash_causal_flop_share"] / (peak * 1e12) * 1000 / m["flash_efficiency_forward"]
    d = arch_doc("megatron_core", seq=seq, hidden=h, heads=32)
    assert middle_forward(d) == pytest.approx(gemm + elementwise + core, rel=1e-9)


@pytest.mark.parametrize("seq", [1024, 4096])
def test_unfused_attention_pays_bytes_per_score_in_hbm(seq):
    """Unfused (the fixtures' stack): the core is GEMMs, and heads x s^2 scores pass through HBM at
    attention_bytes_forward each; the floor overlaps the kernels, the launch adds."""
    cat = Catalog.load()
    m, dev = cat.constants("fixture_megatron"), cat.devices["h100_sxm"]
    h, L, peak, bw = 1024, 2, dev["peak_tflops"], dev["memory_bandwidth_gbps"]
    gemm = L * (24 * seq * h * h + 4 * seq * seq * h) / (peak * 1e12) * 1000 * m["compute_time_coefficient"]
    elementwise = L * 2 * 34 * seq * h / 1e6 / bw
    scores = L * 16 * seq * seq * m["attention_bytes_forward"] / 1e6 / bw
    floor = L * per_gpu(m, "k_floor_ms", "h100_sxm")
    expected = max(gemm + elementwise + scores, floor) + per_gpu(m, "launch_overhead_ms", "h100_sxm")
    assert middle_forward(arch_doc("fixture_megatron", seq=seq)) == pytest.approx(expected, rel=1e-9)


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


def test_unknown_stack_and_host_names_are_one_line_errors():
    d = arch_doc("tensorrt")
    with pytest.raises(HopsError, match=r"^pipeline.stack: got 'tensorrt'; expected one of fixture_megatron, "
                                        r"megatron_core$"):
        load_scenario(d)
