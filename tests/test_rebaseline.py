"""Specifications for gate v3: band-aware per-fixture allowances, and the re-baseline as a human decision.

The allowance and verdict rules are checked on numbers written here (their
arithmetic is the specification); the command itself runs end to end in a
scratch copy of this repository (tests/arscratch.py), because it applies
kept patches to the working tree and judges the patched code in a fresh
interpreter.
"""
import json

import pandas as pd
import pytest

import arscratch
from arscratch import MODEL, dirty, latest, records, tie
from autoresearch.gate import GateConfig, allowance, compare
from autoresearch.rebaseline import verdict

VARIANTS = ("spec", "link_calibrated")


def cfg() -> GateConfig:
    return GateConfig.load()


class Scores:
    """The part of a validate Report that the gate reads: one row per fixture x variant."""

    def __init__(self, errors: dict[str, float]):
        self.rows = [{"id": fid, "variant": v, "throughput_error_pct": e, "bubble_pp_delta": 0.5,
                      "util_spearman_rho": 0.9} for fid, e in errors.items() for v in VARIANTS]

    def table(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)


def golden_of(errors: dict[str, float]) -> dict:
    fixtures = {fid: {v: {"throughput_error_pct": e, "bubble_pp_delta": 0.5, "util_spearman_rho": 0.9}
                      for v in VARIANTS} for fid, e in errors.items()}
    mean = sum(abs(e) for e in errors.values()) / len(errors)
    return {"fixtures": fixtures, "variants": list(VARIANTS),
            "aggregates": {v: {"mape": mean, "bubble_mae_pp": 0.5, "rho_mean": 0.9} for v in VARIANTS}}


# --------------------------------------------------------------------------- allowances
def test_allowance_is_the_tolerance_or_the_configs_measured_spread_whichever_is_larger():
    c = cfg()
    assert allowance(c, None) == (2.0, 2.0), "no duplicate run: gate.yaml's tolerance"
    assert allowance(c, (5.11, 1.26)) == (5.11, 2.0)
    assert allowance(c, (0.74, 2.5)) == (2.0, 2.5), "a spread below the tolerance never tightens it"


def test_a_fixture_may_move_within_its_configs_spread_but_not_one_without_a_duplicate():
    golden = golden_of({"a_run1": 0.5, "b_run2": 0.5})
    now = Scores({"a_run1": -4.0, "b_run2": 0.6})  # a: +3.5 points, inside its 5.11 spread
    out = compare(golden, now, cfg(), bands={"a_run1": (5.11, 1.26), "b_run2": None})
    assert out.allowances == {"a_run1": (5.11, 2.0)}
    assert not out.fixture_violations
    out = compare(golden, Scores({"a_run1": 0.5, "b_run2": 3.0}), cfg(), bands={"a_run1": (5.11, 1.26)})
    assert list(out.fixture_violations) == ["b_run2"]
    assert all("exceeds the 2 tolerance" in line for line in out.fixture_violations["b_run2"])
    out = compare(golden, Scores({"a_run1": 6.0, "b_run2": 0.5}), cfg(), bands={"a_run1": (5.11, 1.26)})
    assert all("exceeds the 5.11 allowance (its config's run-to-run spread)" in line
               for line in out.fixture_violations["a_run1"])


def test_the_gate_report_prints_the_allowance_of_every_duplicated_fixture(fixtures_root):
    from autoresearch import noise

    n = noise.noise(fixtures_root)
    band = n.band("exp2_10_all_nodes_gpipe_run97")
    assert band is not None and band[0] == pytest.approx(6.75, abs=0.01), "its archive rerun is 6.75 % faster"
    assert n.band("exp2_13_a10g_pair_pp2_run135") is None, "no archive pair, no twin"


# --------------------------------------------------------------------------- the verdict
def aggs(mape, bub, rho):
    return {v: {"mape": mape, "bubble_mae_pp": bub, "rho_mean": rho} for v in VARIANTS}


FLOOR = {"mape": 2.37, "bubble_mae_pp": 0.54}


def splits(train_after=aggs(2.5, 0.6, 0.8), archive_after=aggs(2.4, 0.9, 0.7), diag_after=aggs(2.9, 0.5, 0.72)):
    return {"train": (aggs(4.2, 3.1, 0.69), train_after), "archive": (aggs(4.3, 4.3, 0.62), archive_after),
            "diagnostic": (aggs(2.8, 6.0, 0.71), diag_after)}


def test_a_tree_that_improves_everywhere_and_explains_each_violation_is_admitted():
    v = {"x_run1": ["x_run1: spec |throughput error| ..."]}
    assert verdict(splits(), FLOOR, v, [], {"x_run1": "why"}, VARIANTS, "diagnostic") == []


@pytest.mark.parametrize("case, expect", [
    (dict(train_after=aggs(2.5, 0.6, 0.69)), "train: spec rho 0.690 -> 0.690 does not improve"),
    (dict(archive_after=aggs(4.4, 0.9, 0.7)), "archive: spec MAPE 4.300 -> 4.400 worsens"),
    (dict(diag_after=aggs(5.2, 0.5, 0.72)), "diagnostic: spec MAPE 2.800 -> 5.200 worsens by more than 2.37"),
])
def test_each_aggregate_rule_refuses_on_its_own(case, expect):
    out = verdict(splits(**case), FLOOR, {}, [], {}, VARIANTS, "diagnostic")
    assert expect in out


def test_diagnostic_may_worsen_within_the_noise_floor_but_needs_one_measured():
    assert verdict(splits(diag_after=aggs(5.0, 0.5, 0.72)), FLOOR, {}, [], {}, VARIANTS, "diagnostic") == []
    out = verdict(splits(), {}, {}, [], {}, VARIANTS, "diagnostic")
    assert any("no noise floor measured" in r for r in out)


def test_unexplained_violations_other_gate_failures_and_stray_explanations_are_refused():
    out = verdict(splits(), FLOOR, {"x_run1": ["..."]}, ["citation: model.k 1 -> 2 has no citation"],
                  {"y_run2": "why"}, VARIANTS, "diagnostic")
    assert "x_run1: a per-fixture violation remains without an explanation (--explain x_run1=...)" in out
    assert "gate: citation: model.k 1 -> 2 has no citation" in out
    assert "--explain y_run2: not a fixture with a remaining violation" in out


# --------------------------------------------------------------------------- the command
@pytest.fixture(scope="module")
def template(fixtures_root, tmp_path_factory):
    """The stack tests' scratch model, with one archive rerun of a train config so a noise floor exists."""
    base = tmp_path_factory.mktemp("rebaseline-template")
    repo = arscratch.copy_repo(base / "repo")
    arscratch.edit(repo, MODEL, "tied_embeddings: true", "tied_embeddings: false")
    arscratch.commit(repo, "a model one correction behind")
    root = arscratch.link_fixtures(fixtures_root, base / "fixtures", (*arscratch.TRAIN, "exp2_9_g_only_pp4_run107"),
                                   arscratch.DIAGNOSTIC, archive=("exp2_9_g_only_pp4_run65",))
    cli = arscratch.Cli(repo, base / "ledger" / "mlflow.db", root)
    code, out, err = cli("admit", "--bootstrap")
    assert code == 0, out + err
    arscratch.commit(repo, "golden file")
    return cli


@pytest.fixture
def cli(template, tmp_path):
    return arscratch.clone(template.repo, template.db, template.fixtures, tmp_path)


def reverted_tie(cli) -> int:
    """Close the tie correction as reverted, its patch kept (as iteration 26 was)."""
    n = arscratch.propose(cli, "tie embeddings")
    tie(cli.repo)
    code, out, err = cli("revert", "--reason", "held back for a re-baseline")
    assert code == 0, out + err
    arscratch.commit(cli.repo, f"revert it{n}")
    return n


def test_rebaseline_refuses_in_one_line_without_a_human_reason(cli):
    n = reverted_tie(cli)
    code, out, err = cli("rebaseline", "--on", str(n))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "--confirm-human" in err
    assert dirty(cli) == [] and latest(cli, n)["outcome"] == "reverted"


def test_a_refused_rebaseline_leaves_the_tree_golden_file_and_records_as_they_were(cli):
    n = reverted_tie(cli)
    before = (cli.repo / "autoresearch" / "golden" / "train.json").read_text()
    lines = len(records(cli))
    code, out, err = cli("rebaseline", "--on", str(n), "--confirm-human", "test",
                         "--explain", "exp2_13_a10g_pair_pp2_run135=not a violation")
    assert code == 1, out + err
    assert "rebaseline refused" in out and "--explain exp2_13_a10g_pair_pp2_run135: not a fixture" in out
    assert dirty(cli) == [], "the patches are taken out again"
    assert (cli.repo / "autoresearch" / "golden" / "train.json").read_text() == before
    assert len(records(cli)) == lines


def test_rebaseline_lands_a_kept_tree_once_and_records_every_members_before_and_after(cli):
    n = reverted_tie(cli)
    old = json.loads((cli.repo / "autoresearch" / "golden" / "train.json").read_text())
    code, out, err = cli("rebaseline", "--on", str(n), "--confirm-human", "held-out aggregates improve")
    if code == 1 and "does not improve" in out:
        pytest.fail("the scratch correction must improve every train aggregate for this test:\n" + out)
    assert code == 0, out + err
    assert "re-baseline evidence" in out and "archive" in out and "noise floor" in out
    new = json.loads((cli.repo / "autoresearch" / "golden" / "train.json").read_text())
    assert new["aggregates"]["spec"]["mape"] < old["aggregates"]["spec"]["mape"]
    member = latest(cli, n)
    assert member["outcome"] == "rebaselined" and member["previous_outcome"] == "reverted"
    top = records(cli)[-1]
    assert top["outcome"] == "rebaselined" and top["stack"] == [n] and top["reason"] == "held-out aggregates improve"
    assert set(top["splits"]) == {"archive", "diagnostic"} and top["noise_floor"]["mape"] >= 0
    assert member["after"] == top["after"] and member["before"] == top["before"]
    assert new["admitted"]["iteration"] == top["iteration"]
    assert "tied_embeddings: true" in (cli.repo / MODEL).read_text(), "the tree stays, to be committed"
    log = (cli.repo / "autoresearch" / "LOG.md").read_text()
    assert f"## Iteration {top['iteration']}: rebaselined" in log
    arscratch.commit(cli.repo, "re-baseline")
    assert cli("gate")[0] == 0, "later iterations face the unchanged gate against the new golden file"


def test_holding_counts_as_improving_only_for_a_metric_already_at_its_best():
    perfect = {v: {"mape": 2.0, "bubble_mae_pp": 0.5, "rho_mean": 1.0} for v in VARIANTS}
    better = {v: {"mape": 1.0, "bubble_mae_pp": 0.4, "rho_mean": 1.0} for v in VARIANTS}
    s = splits()
    s["train"] = (perfect, better)
    assert verdict(s, FLOOR, {}, [], {}, VARIANTS, "diagnostic") == []


# --------------------------------------------------------------------------- assumptions
def test_an_assumption_may_back_a_preset_outside_the_fixture_cluster_but_never_one_it_reads():
    from autoresearch.gate import citation_violations

    c = cfg()
    cites = [{"path": p, "value": 0.2, "source": "stated next to it", "kind": "assumption"}
             for p in ("stacks.megatron_core.k_floor_ms.default", "stacks.fixture_megatron.k_floor_ms.default",
                       "devices.l4.peak_tflops")]
    changes = [(x["path"], 0.1, 0.2) for x in cites]
    out = citation_violations(changes, cites, c)
    assert len(out) == 2 and all("kind `assumption` is refused" in v for v in out)
    assert not any("megatron_core" in v for v in out)
