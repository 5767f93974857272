"""Specifications for turning Megatron traces and link benchmarks into ground truth."""
import json
from pathlib import Path

import numpy as np
import pytest

from hops.errors import TraceError
from hops.metrics import summarize
from hops.timeline import KINDS, PHASES
from hops.traces import fit_link_bench, link_overrides, load_trace

DEVICES = ["gpu_a", "gpu_b"]
T0 = 1_700_000_000_000_000_000


def event(stage, iteration, mb, phase, start_ms, dur_ms, event_type="compute", **extra):
    rec = {"rank": stage, "stage": stage, "iteration": iteration, "microbatch": mb, "event_type": event_type,
           "phase": phase, "start_wall_ns": T0 + int(start_ms * 1e6), "end_wall_ns": T0 + int((start_ms + dur_ms) * 1e6),
           "duration_ms": dur_ms, "device_id": DEVICES[stage], "hostname": f"host{stage}"}
    if event_type == "transfer":
        rec.update(src_device=DEVICES[stage], dst_device=DEVICES[1 - stage])
    rec.update(extra)
    return rec


def two_stage_trace(iterations=(5, 6), mbs=2, split_backward=False):
    """A tiny but complete 2-stage run: F, send, F, B (or B+W), send back, optimizer."""
    ranks = {0: [], 1: []}
    t = 10.0
    bwd = ["BACKWARD_INPUT", "BACKWARD_WEIGHT"] if split_backward else ["BACKWARD"]
    for it in iterations:
        for mb in range(mbs):
            ranks[0].append(event(0, it, mb, "FORWARD", t, 1.0))
            ranks[0].append(event(0, it, mb, "FORWARD", t + 1.0, 0.1, "transfer"))
            ranks[1].append(event(1, it, mb, "FORWARD", t + 1.2, 1.0))
            for k, ph in enumerate(bwd):
                ranks[1].append(event(1, it, mb, ph, t + 2.2 + k, 1.0))
            ranks[1].append(event(1, it, mb, bwd[0], t + 2.2 + len(bwd), 0.1, "transfer"))
            for k, ph in enumerate(bwd):
                ranks[0].append(event(0, it, mb, ph, t + 2.5 + len(bwd) + k, 1.0))
            t += 10.0
        for s in (0, 1):
            ranks[s].append(event(s, it, mbs - 1, "OPTIMIZER", t, 2.0))
        t += 5.0
    return ranks


def write_fixture(root: Path, ranks, noise=False) -> Path:
    (root / "megatron_trace").mkdir(parents=True)
    (root / "hops_trace_map.json").write_text(json.dumps({"stages": {str(i): d for i, d in enumerate(DEVICES)}}))
    for rank, events in ranks.items():
        lines = [json.dumps(e) for e in events]
        if noise:
            lines = ["NCCL INFO Bootstrap : Using eth0", *lines[:2], "[rank0] warning: something", "", *lines[2:]]
        (root / "megatron_trace" / f"rank{rank}.jsonl").write_text("\n".join(lines) + "\n")
    return root


def load(root, tmp_path):
    return load_trace(root, cache_dir=tmp_path / "cache")


# ---------------------------------------------------------------- importer, synthetic


def test_noise_lines_are_skipped_and_nothing_else_is(tmp_path):
    ranks = two_stage_trace()
    clean = load(write_fixture(tmp_path / "clean", ranks), tmp_path)
    noisy = load(write_fixture(tmp_path / "noisy", ranks, noise=True), tmp_path)
    assert len(noisy) == len(clean) == sum(len(v) for v in ranks.values())
    assert np.array_equal(noisy.start_ms, clean.start_ms)


def test_columns_mapping_and_time_origin(tmp_path):
    tl = load(write_fixture(tmp_path / "f", two_stage_trace()), tmp_path)
    assert tl.stage_devices == tuple(DEVICES)
    assert set(tl.kind) <= set(KINDS) and set(tl.phase) <= set(PHASES)
    assert tl.start_ms.min() == 0.0  # relative to the earliest event
    assert set(tl.phase[tl.kind == "compute"]) == {"F", "BW"}  # fused backward stays BW
    opt = tl.kind == "optimizer"
    assert opt.sum() == 4 and set(tl.phase[opt]) == {"OPT"} and set(tl.microbatch[opt]) == {-1}
    tr = tl.kind == "transfer"
    fwd = tr & (tl.phase == "F")
    assert set(tl.stage[fwd]) == {0} and set(tl.src[fwd]) == {"gpu_a"} and set(tl.dst[fwd]) == {"gpu_b"}
    bwd = tr & (tl.phase == "BW")
    assert set(tl.stage[bwd]) == {1} and set(tl.src[bwd]) == {"gpu_b"} and set(tl.dst[bwd]) == {"gpu_a"}
    assert set(tl.src[~tr]) == {""}


def test_split_backward_maps_to_b_and_w(tmp_path):
    tl = load(write_fixture(tmp_path / "f", two_stage_trace(split_backward=True)), tmp_path)
    compute = tl.kind == "compute"
    assert set(tl.phase[compute]) == {"F", "B", "W"}
    assert (tl.phase[compute] == "B").sum() == (tl.phase[compute] == "W").sum() == 8


def test_global_microbatch_ids_and_iteration_index(tmp_path):
    tl = load(write_fixture(tmp_path / "f", two_stage_trace(iterations=(3, 4, 7), mbs=3)), tmp_path)
    assert tl.microbatches_per_iteration == 3
    assert sorted(set(tl.iteration)) == [0, 1, 2]  # raw 3, 4, 7 -> order of appearance
    compute = tl.kind == "compute"
    assert sorted(set(tl.microbatch[compute])) == list(range(9))
    assert np.array_equal(tl.microbatch[compute] // 3, tl.iteration[compute])
    assert tl.meta["raw_iterations"] == [3, 4, 7]


def test_metrics_apply_to_imported_trace(tmp_path):
    s = summarize(load(write_fixture(tmp_path / "f", two_stage_trace(iterations=range(4))), tmp_path))
    assert s["window"]["completed_microbatches"] == 8
    assert 0.0 < s["bubble_ratio"] < 1.0


def _mutate(ranks, field=None, value=None, drop=None, raw=None):
    """Break the 3rd event of rank 1 (line 3 of rank1.jsonl)."""
    ranks = {k: [dict(e) for e in v] for k, v in ranks.items()}
    target = ranks[1][2]
    if field:
        target[field] = value
    if drop:
        del target[drop]
    if raw is not None:
        ranks[1][2] = raw
    return ranks


class Raw(dict):
    """An event line written verbatim (for invalid JSON)."""


@pytest.mark.parametrize("mutation, words", [
    (dict(drop="start_wall_ns"), "missing field 'start_wall_ns'"),
    (dict(drop="dst_device"), None),  # filled below: only transfers need it
    (dict(field="phase", value="RECOMPUTE"), "unknown phase 'RECOMPUTE'"),
    (dict(field="event_type", value="memcpy"), "unknown event_type 'memcpy'"),
    (dict(field="end_wall_ns", value=T0), "before start_wall_ns"),
    (dict(field="stage", value="1"), "field 'stage'"),
    (dict(field="stage", value=7), "not in hops_trace_map.json"),
])
def test_each_error_names_file_and_line(tmp_path, mutation, words):
    ranks = two_stage_trace()
    if mutation.get("drop") == "dst_device":  # make line 3 a transfer so the field is required
        ranks[1][2] = event(1, 5, 0, "BACKWARD", 13.0, 0.1, "transfer")
        words = "missing field 'dst_device'"
    root = write_fixture(tmp_path / "f", _mutate(ranks, **mutation))
    with pytest.raises(TraceError) as err:
        load(root, tmp_path)
    msg = str(err.value)
    assert "rank1.jsonl:3: " in msg and words in msg and "expected" in msg
    assert "\n" not in msg


@pytest.mark.parametrize("field, value, words", [
    ("end_wall_ns", T0 + 10**15, "event lasts 999,999,986,800,000 ns (1e+06 s) but the rest of the run spans 47,000,000 ns (0.047 s)"),
    ("start_wall_ns", T0 - 10**15, "event lasts"),
    ("end_wall_ns", 2**63, "end_wall_ns 9223372036854775808 is beyond int64"),
    ("start_wall_ns", -2**63 - 1, "start_wall_ns -9223372036854775809 is beyond int64"),
    ("end_wall_ns", 10**40, "end_wall_ns 10000000000000000000000000000000000000000 is beyond int64"),
    ("start_wall_ns", -5, "start_wall_ns -5 is negative, expected a wall-clock time in ns since the Unix epoch"),
])
def test_an_event_that_cannot_belong_to_the_run_is_refused(tmp_path, field, value, words):
    """A 12-day compute event in a run of milliseconds, or a time past int64, imported cleanly and
    stretched the measured window a millionfold (bubble error in the millions, rho -1)."""
    root = write_fixture(tmp_path / "f", _mutate(two_stage_trace(), field=field, value=value))
    with pytest.raises(TraceError) as err:
        load(root, tmp_path)
    msg = str(err.value)
    assert "rank1.jsonl:3: " in msg and words in msg and "expected" in msg, msg
    assert "\n" not in msg


@pytest.mark.parametrize("shift, where", [(-10**15, "before"), (10**15, "after")])
def test_a_short_event_shifted_away_from_its_run_is_refused(tmp_path, shift, where):
    """A well-formed event whose clock jumped: its duration is plausible, its place is not."""
    ranks = _mutate(two_stage_trace())
    ranks[1][2] = {**ranks[1][2], "start_wall_ns": ranks[1][2]["start_wall_ns"] + shift,
                   "end_wall_ns": ranks[1][2]["end_wall_ns"] + shift}
    with pytest.raises(TraceError) as err:
        load(write_fixture(tmp_path / "f", ranks), tmp_path)
    msg = str(err.value)
    assert "rank1.jsonl:3: event lies " in msg and f"s) {where} the rest of the run, which spans" in msg, msg
    assert "\n" not in msg


def test_the_longest_real_event_is_still_inside_its_run(tmp_path):
    """The bound is the rest of the run's span, so a long but real event (a slow optimizer step
    at the end, a first forward that waited on the data loader) still imports."""
    ranks = two_stage_trace()
    ranks[0][0] = event(0, 5, 0, "FORWARD", 0.0, 11.0)  # starts before everything, ends inside
    ranks[1][-1] = event(1, 6, 1, "OPTIMIZER", 60.0, 30.0)  # ends after everything else
    tl = load(write_fixture(tmp_path / "f", ranks), tmp_path)
    assert tl.end_ms.max() - tl.start_ms.min() == pytest.approx(90.0)


def test_invalid_json_names_file_and_line(tmp_path):
    root = write_fixture(tmp_path / "f", two_stage_trace())
    path = root / "megatron_trace" / "rank0.jsonl"
    lines = path.read_text().splitlines()
    lines[4] = lines[4][:-5]  # truncated write
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=r"rank0\.jsonl:5: invalid JSON .*expected"):
        load(root, tmp_path)


def test_cache_hit_returns_identical_arrays_and_edits_invalidate(tmp_path):
    root = write_fixture(tmp_path / "f", two_stage_trace())
    cache = tmp_path / "cache"
    first = load_trace(root, cache_dir=cache)
    assert len(list(cache.glob("*.npz"))) == 1
    again = load_trace(root, cache_dir=cache)
    for name in ("kind", "stage", "device", "microbatch", "phase", "start_ms", "end_ms", "src", "dst", "iteration"):
        a, b = getattr(first, name), getattr(again, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert again.stage_devices == first.stage_devices
    assert again.microbatches_per_iteration == first.microbatches_per_iteration
    # A changed trace is a different key: never served a stale Timeline.
    path = root / "megatron_trace" / "rank0.jsonl"
    path.write_text(path.read_text().replace('"duration_ms": 1.0', '"duration_ms": 1.00'))
    load_trace(root, cache_dir=cache)
    assert len(list(cache.glob("*.npz"))) == 2


def test_cache_dir_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("HOPS_CACHE", str(tmp_path / "envcache"))
    load_trace(write_fixture(tmp_path / "f", two_stage_trace()))
    assert list((tmp_path / "envcache").glob("*.npz"))


def test_no_trace_files_is_an_error(tmp_path):
    root = write_fixture(tmp_path / "f", {})
    with pytest.raises(TraceError, match="no rank"):
        load(root, tmp_path)


# ---------------------------------------------------------------- importer: nothing lost, nothing silent


def _rewrite(root: Path, rank: int, fn) -> Path:
    path = root / "megatron_trace" / f"rank{rank}.jsonl"
    path.write_bytes(fn(path.read_bytes()))
    return path


@pytest.mark.parametrize("prefix", ["[default0]:", "[default1]: ", "[rank0]:", "[default0]:[rank0]:", "  [trainer12]:"])
def test_launcher_prefixed_events_are_parsed_not_skipped(tmp_path, prefix):
    ranks = two_stage_trace()
    clean = load(write_fixture(tmp_path / "clean", ranks), tmp_path)
    root = write_fixture(tmp_path / "tee", ranks)
    for r in ranks:  # torchrun --tee: every line of the worker's stdout gets the prefix, banners too
        _rewrite(root, r, lambda b: b"".join(prefix.encode() + ln for ln in [b"NCCL INFO Bootstrap\n",
                                                                            *b.splitlines(keepends=True)]))
    tee = load(root, tmp_path)
    assert len(tee) == len(clean) == sum(len(v) for v in ranks.values())
    assert np.array_equal(tee.start_ms, clean.start_ms) and np.array_equal(tee.phase, clean.phase)


def test_an_event_behind_an_unknown_prefix_is_an_error(tmp_path):
    root = write_fixture(tmp_path / "f", two_stage_trace())
    _rewrite(root, 1, lambda b: b.replace(b"{", b"2026-01-01 12:00:00 INFO {", 1))
    with pytest.raises(TraceError, match=r"rank1\.jsonl:1: an event behind an unrecognised prefix"):
        load(root, tmp_path)


def test_a_missing_rank_file_is_an_error_naming_it(tmp_path):
    ranks = two_stage_trace()
    ranks[2] = [dict(e, rank=2) for e in ranks[1]]  # ranks 0, 1, 2 ...
    root = write_fixture(tmp_path / "f", ranks)
    (root / "megatron_trace" / "rank1.jsonl").unlink()  # ... and rank1 lost
    with pytest.raises(TraceError, match=r"rank1\.jsonl: file missing \(ranks found: 0, 2\)"):
        load(root, tmp_path)


def test_an_unreadable_rank_file_is_an_error_naming_it(tmp_path):
    root = write_fixture(tmp_path / "f", two_stage_trace())
    path = root / "megatron_trace" / "rank1.jsonl"
    path.unlink()
    path.symlink_to(tmp_path / "gone.jsonl")  # dangling: listed by glob, cannot be opened
    with pytest.raises(TraceError, match=r"rank1\.jsonl: cannot read"):
        load(root, tmp_path)


@pytest.mark.parametrize("content, words", [
    (b"", r"rank1\.jsonl: empty file"),
    (b"NCCL INFO Bootstrap\n\n[default1]:NCCL WARN retry\n", r"rank1\.jsonl: no trace events \(only log noise\)"),
])
def test_an_empty_rank_file_is_an_error_naming_it(tmp_path, content, words):
    root = write_fixture(tmp_path / "f", two_stage_trace())
    _rewrite(root, 1, lambda b: content)
    with pytest.raises(TraceError, match=words):
        load(root, tmp_path)


def test_a_rank_file_cut_mid_line_is_an_error_naming_it(tmp_path):
    root = write_fixture(tmp_path / "f", two_stage_trace())
    path = _rewrite(root, 1, lambda b: b[:-40])  # killed while writing the last event
    n = len(path.read_bytes().splitlines())
    with pytest.raises(TraceError, match=rf"rank1\.jsonl:{n}: truncated last line"):
        load(root, tmp_path)


def test_a_rank_file_cut_at_a_line_boundary_is_an_error_naming_it(tmp_path):
    root = write_fixture(tmp_path / "f", two_stage_trace())
    _rewrite(root, 1, lambda b: b"".join(b.splitlines(keepends=True)[:-3]))  # parses cleanly, lost events
    with pytest.raises(TraceError, match=r"rank1\.jsonl: stage 1 has no backward of microbatch 1 in iteration 6"):
        load(root, tmp_path)


def test_a_stage_with_no_events_is_an_error(tmp_path):
    ranks = two_stage_trace()
    ranks[1] = [e for e in ranks[1] if e["event_type"] == "transfer"]  # stage 1 logged sends only
    with pytest.raises(TraceError, match=r"stage 1 \(gpu_b\) has no compute events"):
        load(write_fixture(tmp_path / "f", ranks), tmp_path)


@pytest.mark.parametrize("garbage, words", [
    (b"\x00\x00\x00\x00PK\x03\x04", r"rank0\.jsonl:3: binary data \(NUL byte\)"),
    (b"\xff\xfe{\"stage\": 0}", r"rank0\.jsonl:3: not UTF-8 \(byte 0xff at column 1\)"),
])
def test_a_binary_rank_file_is_an_error_naming_file_and_line(tmp_path, garbage, words):
    root = write_fixture(tmp_path / "f", two_stage_trace())
    _rewrite(root, 0, lambda b: b"".join(b.splitlines(keepends=True)[:2]) + garbage + b"\n" + b)
    with pytest.raises(TraceError, match=words):
        load(root, tmp_path)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_non_finite_numbers_in_a_trace_are_errors(tmp_path, literal):
    root = write_fixture(tmp_path / "f", two_stage_trace())
    _rewrite(root, 1, lambda b: b.replace(b'"duration_ms": 1.0', f'"duration_ms": {literal}'.encode(), 1))
    with pytest.raises(TraceError, match=r"rank1\.jsonl:\d+: .*(not a number|finite)"):
        load(root, tmp_path)


def test_a_utf8_byte_order_mark_is_not_data_loss(tmp_path):
    ranks = two_stage_trace()
    clean = load(write_fixture(tmp_path / "clean", ranks), tmp_path)
    root = write_fixture(tmp_path / "bom", ranks)
    _rewrite(root, 0, lambda b: b"\xef\xbb\xbf" + b)
    assert len(load(root, tmp_path)) == len(clean)


# ---------------------------------------------------------------- link bench, synthetic


def write_bench(root: Path, rows_by_pair: dict, devices=("d0", "d1", "d2")):
    bench = root / "calibration" / "link_bench"
    bench.mkdir(parents=True)
    (root / "hops_trace_map.json").write_text(json.dumps({"stages": {str(i): d for i, d in enumerate(devices)}}))
    for (i, j), rows in rows_by_pair.items():
        lines = ["NCCL version 2.28.9+cuda13.0"] + [json.dumps(r) for r in rows]
        (bench / f"pair_{i}_{j}.jsonl").write_text("\n".join(lines) + "\n")
    return root


def bench_rows(sizes, alpha, beta, receiver_noise=5.0):
    rows = []
    for s in sizes:
        rows.append({"rank": 0, "size_mb": s, "p50_ms": alpha + s / beta, "mean_ms": 0.0})
        rows.append({"rank": 1, "size_mb": s, "p50_ms": receiver_noise * (alpha + s / beta)})
    return rows


def test_link_fit_recovers_alpha_beta_from_sender_rank(tmp_path):
    root = write_bench(tmp_path, {(0, 1): bench_rows([1, 2, 4, 16, 64], 0.05, 12.5),
                                  (1, 2): bench_rows([1, 8, 32], 0.3, 1.2)})
    fits = fit_link_bench(root)
    assert [(f["src"], f["dst"]) for f in fits] == [("d0", "d1"), ("d1", "d2")]
    assert fits[0]["latency_ms"] == pytest.approx(0.05, abs=1e-12)
    assert fits[0]["bandwidth_gbps"] == pytest.approx(12.5, rel=1e-12)
    assert fits[1]["latency_ms"] == pytest.approx(0.3, abs=1e-12)
    assert fits[1]["bandwidth_gbps"] == pytest.approx(1.2, rel=1e-12)
    assert fits[0]["sizes_mb"] == [1, 2, 4, 16, 64] and fits[0]["source"] == "link_bench"


def test_link_fit_clamps_to_physical_values(tmp_path):
    # Curved data (fast small messages) gives a negative OLS intercept.
    rows = [{"rank": 0, "size_mb": s, "p50_ms": t} for s, t in [(1, 0.3), (2, 0.96), (4, 3.3), (16, 13.5), (64, 54.0)]]
    fit = fit_link_bench(write_bench(tmp_path / "a", {(0, 1): rows}))[0]
    assert fit["latency_ms"] == 0.0 and fit["bandwidth_gbps"] > 0
    single = fit_link_bench(write_bench(tmp_path / "b", {(0, 1): bench_rows([4], 0.1, 2.0)}))[0]
    assert single["latency_ms"] == 0.0 and single["bandwidth_gbps"] == pytest.approx(4 / 2.1)
    flat = [{"rank": 0, "size_mb": s, "p50_ms": t} for s, t in [(1, 1.0), (2, 0.9)]]
    assert fit_link_bench(write_bench(tmp_path / "c", {(0, 1): flat}))[0]["bandwidth_gbps"] > 0


def test_link_overrides_cover_both_directions(tmp_path):
    root = write_bench(tmp_path, {(0, 1): bench_rows([1, 4], 0.1, 5.0)})
    links = link_overrides(root)["links"]
    assert {(lk["src"], lk["dst"]) for lk in links} == {("d0", "d1"), ("d1", "d0")}
    assert links[0]["bandwidth_gbps"] == links[1]["bandwidth_gbps"] == pytest.approx(5.0)
    assert set(links[0]) == {"src", "dst", "latency_ms", "bandwidth_gbps"}


@pytest.mark.parametrize("bad, words", [
    ('{"rank": 0, "size_mb": 1', "invalid JSON"),
    ('{"rank": 0, "size_mb": 1}', "missing field 'p50_ms'"),
    ('{"rank": 0, "size_mb": "big", "p50_ms": 1}', "field 'size_mb'"),
    ('{"rank": 0, "size_mb": 0, "p50_ms": 1}', "expected both > 0"),
])
def test_malformed_link_bench_names_file_and_line(tmp_path, bad, words):
    root = write_bench(tmp_path, {(0, 1): bench_rows([1, 2], 0.1, 5.0)})
    path = root / "calibration" / "link_bench" / "pair_0_1.jsonl"
    path.write_text(path.read_text() + bad + "\n")
    with pytest.raises(TraceError, match=rf"pair_0_1\.jsonl:6: .*{words}"):
        fit_link_bench(root)


@pytest.mark.parametrize("bad, words", [
    ('{"rank": 0, "size_mb": 8, "p50_ms": Infinity}', "not a number"),
    ('{"rank": 0, "size_mb": 8, "p50_ms": NaN}', "not a number"),
    ('{"rank": 0, "size_mb": 8, "p50_ms": 1e999}', "expected a finite number"),
    ('{"rank": 1, "size_mb": 8, "p50_ms": -Infinity}', "not a number"),  # receiver rows are checked too
    ('{"rank": 1, "size_mb": 8, "p50_ms": 2.0, "p99_ms": -3.0}', "field 'p99_ms' is -3.0, expected a finite number >= 0"),
    ('{"rank": 0, "size_mb": -8, "p50_ms": 2.0}', "expected a finite number >= 0"),
    ('{"rank": -1, "size_mb": 8, "p50_ms": 2.0}', "field 'rank' is -1, expected an integer >= 0"),
    ('{"rank": 0, "size_mb": 1, "p50_ms": 0.3}', "size_mb=1 of rank 0 already on line 2"),
    ('2026-01-01 {"rank": 0, "size_mb": 8, "p50_ms": 2.0}', "an event behind an unrecognised prefix"),
])
def test_link_bench_values_that_are_not_measurements_are_errors(tmp_path, bad, words):
    root = write_bench(tmp_path, {(0, 1): bench_rows([1, 2], 0.1, 5.0)})
    path = root / "calibration" / "link_bench" / "pair_0_1.jsonl"
    path.write_text(path.read_text() + bad + "\n")
    with pytest.raises(TraceError) as err:
        fit_link_bench(root)
    assert "pair_0_1.jsonl:6: " in str(err.value) and words in str(err.value)


def test_link_bench_with_launcher_prefix_is_parsed(tmp_path):
    plain = fit_link_bench(write_bench(tmp_path / "a", {(0, 1): bench_rows([1, 4, 16], 0.1, 5.0)}))
    root = write_bench(tmp_path / "b", {(0, 1): bench_rows([1, 4, 16], 0.1, 5.0)})
    path = root / "calibration" / "link_bench" / "pair_0_1.jsonl"
    path.write_text("".join(f"[default0]:{ln}\n" for ln in path.read_text().splitlines()))
    assert fit_link_bench(root) == plain


def test_no_link_bench_is_no_fit_and_no_error(tmp_path):
    (tmp_path / "hops_trace_map.json").write_text(json.dumps({"stages": {"0": "d0", "1": "d1"}}))
    assert fit_link_bench(tmp_path) == [] and link_overrides(tmp_path) == {"links": []}


# ---------------------------------------------------------------- real fixtures


def fixture_dirs(root: Path, split: str):
    dirs = sorted(p for p in (root / split / "cluster_results").glob("*") if p.is_dir())
    if not dirs:
        pytest.fail(f"no fixtures under {root / split / 'cluster_results'}")
    return dirs


def test_real_train_traces_import_completely(fixtures_root, tmp_path):
    for d in fixture_dirs(fixtures_root, "train"):
        tl = load_trace(d, cache_dir=tmp_path)
        lines = sum(1 for f in (d / "megatron_trace").glob("rank*.jsonl") for ln in open(f) if ln.lstrip().startswith("{"))
        assert len(tl) == lines, d.name
        assert len(tl.stage_devices) == len(json.loads((d / "hops_trace_map.json").read_text())["stages"])
        compute = tl.kind == "compute"
        n_iter = len(np.unique(tl.iteration))
        assert len(np.unique(tl.microbatch[compute])) == n_iter * tl.microbatches_per_iteration, d.name
        assert np.all(tl.end_ms >= tl.start_ms) and tl.start_ms.min() == 0.0


def test_real_trace_agrees_with_megatron_summary_where_definitions_match(fixtures_root, tmp_path):
    """Same microbatch count and latency; throughput/bubble differ by definition (fixtures/README.md)."""
    for d in fixture_dirs(fixtures_root, "train")[:6]:
        s = summarize(load_trace(d, cache_dir=tmp_path))
        ref = json.loads((d / "megatron_summary.json").read_text())
        assert s["window"]["completed_microbatches"] == ref["completed_microbatches"], d.name
        assert s["latency_ms"]["p50"] == pytest.approx(ref["latency_ms"]["p50_ms"], rel=1e-9), d.name


def test_real_link_bench_bandwidth_is_positive(fixtures_root):
    for d in fixture_dirs(fixtures_root, "train"):
        fits = fit_link_bench(d)
        assert fits, d.name
        for f in fits:
            assert f["bandwidth_gbps"] > 0 and f["latency_ms"] >= 0, (d.name, f)
