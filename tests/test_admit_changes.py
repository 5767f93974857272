"""Specifications for what `admit` lands: an iteration that changed something.

The README's round is propose -> (change the code or presets) -> gate -> admit. Skipping the
change used to land the iteration as `landed` with a clean diff, rewrite the golden file and record
a change site nobody touched. Each test works in its own clone of a scratch copy of this repository
(tests/arscratch.py), because the diff of the git working tree is what is judged.
"""
import json

from arscratch import cli, golden, propose, records, template  # cli, template: pytest fixtures

SITE = "hops/model/compute.py"


def test_admit_refuses_an_iteration_that_changes_nothing_and_says_what_to_do(cli):
    before = (cli.repo / "autoresearch" / "golden" / "train.json").read_bytes()
    code, out, err = cli("propose", "--hypothesis", "last-stage forward misses the LM-head softmax",
                         "--change-site", SITE, "--expect", "last-stage F error halves")
    assert code == 0, out + err
    n = int(out.split("opened iteration ", 1)[1].split()[0])
    assert cli("gate")[0] == 0, "the untouched tree passes its own golden file"
    code, out, err = cli("admit")
    assert code == 2, out + err
    (line,) = err.strip().splitlines()
    assert f"iteration {n} changes nothing" in line and f"a change to {SITE} that never happened" in line
    assert "make the change" in line and "revert --reason" in line
    assert (cli.repo / "autoresearch" / "golden" / "train.json").read_bytes() == before, "golden file untouched"
    assert not [r for r in records(cli) if r["iteration"] == n], "nothing recorded as landed"
    assert cli.ledger().open_iteration().data.tags["iteration"] == str(n), "the iteration stays open"
    code, out, err = cli("revert", "--reason", "not pursued")
    assert code == 0, out + err
    assert [r["outcome"] for r in records(cli) if r["iteration"] == n] == ["reverted"]


def test_a_change_that_moves_no_number_is_still_a_change_and_lands(cli):
    """A comment is a diff someone made: admit judges the change, not whether it moved a score."""
    g0 = golden(cli)
    n = propose(cli, "document the compute model")
    f = cli.repo / SITE
    f.write_text(f.read_text() + "\n# the LM-head softmax is charged in the last stage's forward\n")
    code, out, err = cli("admit")
    assert code == 0 and f"admitted iteration {n}" in out, out + err
    g1 = golden(cli)
    assert g1["admitted"]["iteration"] == n and g1["aggregates"] == g0["aggregates"]
    assert json.dumps(g1["fixtures"], sort_keys=True) == json.dumps(g0["fixtures"], sort_keys=True)
    assert [r["outcome"] for r in records(cli) if r["iteration"] == n] == ["landed"]
