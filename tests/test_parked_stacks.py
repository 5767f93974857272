"""Specifications for parked and stacked iterations: park, propose --on, admit of a stack, revert of a stack.

Each test works in its own clone of a scratch copy of this repository (see
tests/arscratch.py), because these commands save, apply and restore diffs of
the git working tree. The scratch model starts two corrections behind the
real one (the embedding gradient all-reduce off, and in bf16 instead of fp32);
the golden file is bootstrapped from that, so restoring each correction is a
real, measured improvement that the tests can stack.
"""
import json

import pytest

import arscratch
from arscratch import cli, dirty, edit, fp32, golden, latest, MODEL, propose, records, template, tie  # cli, template: pytest fixtures


def park_a(cli) -> int:
    n = propose(cli, "tie embeddings")
    tie(cli.repo)
    assert cli("gate")[0] == 0
    code, out, err = cli("park")
    assert code == 0, out + err
    arscratch.commit(cli.repo, f"park it{n}")
    return n


def close(a: dict, b: dict) -> bool:
    return all(abs(a[v][m] - b[v][m]) < 1e-9 for v in ("spec", "link_calibrated") for m in ("mape", "bubble_mae_pp"))


# --------------------------------------------------------------------------- park
def test_park_saves_the_diff_as_a_patch_restores_the_tree_and_links_it_from_the_log(cli):
    n = propose(cli, "tie embeddings")
    tie(cli.repo)
    (cli.repo / "docs" / "note-it.md").write_text("a new file belongs to the change too\n")
    assert cli("gate")[0] == 0
    code, out, err = cli("park")
    assert code == 0, out + err
    rec = latest(cli, n)
    assert rec["outcome"] == "parked" and rec["patch"] == f"patches/it{n}-tie-embeddings.patch"
    patch = cli.repo / "autoresearch" / rec["patch"]
    text = patch.read_text()
    assert "tied_embeddings: true" in text and "docs/note-it.md" in text
    assert dirty(cli) == [], "park restores the working tree (the diff lives in the patch)"
    arscratch.git(cli.repo, "apply", "--check", str(patch))  # the change can be redone byte for byte
    log = (cli.repo / "autoresearch" / "LOG.md").read_text()
    assert f"## Iteration {n}: parked — tie embeddings" in log and f"]({rec['patch']})" in log
    it = cli.ledger().get_run(rec["run_id"])
    assert it.data.tags["outcome"] == "parked" and it.info.status == "KILLED"
    assert "PASS" in it.data.tags["last_gate_report"]


def test_park_is_refused_without_a_gate_of_this_tree_or_without_an_aggregate_gain(cli):
    n = propose(cli, "fp32 grads alone")
    fp32(cli.repo)  # with the embedding sync off, its byte width changes nothing: no gain of its own
    code, _, err = cli("park")
    assert code == 2 and "no gate run yet" in err
    assert cli("gate", "--set", "stacks.fixture_megatron.k_floor_ms.default=1.5")[0] == 1
    code, _, err = cli("park")
    assert code == 2 and "what-if" in err
    assert cli("gate")[0] == 0
    code, _, err = cli("park")
    assert code == 2 and "improves no gated aggregate" in err
    tie(cli.repo)  # the tree moved on after its gate
    code, _, err = cli("park")
    assert code == 2 and "changed since" in err
    assert not any(r["iteration"] == n for r in records(cli)), "a refused park records nothing"
    assert cli("revert", "--reason", "test")[0] == 0


# --------------------------------------------------------------------------- stacks
def test_a_stack_lands_every_member_as_its_own_iteration_measured_cumulatively(cli):
    g0 = golden(cli)
    a = park_a(cli)
    parked_after = latest(cli, a)["after"]
    b = propose(cli, "fp32 embedding grads", "--on", str(a))
    assert "tied_embeddings: true" in (cli.repo / MODEL).read_text(), "--on applies the parked patch"
    run = cli.ledger().open_iteration()
    assert run.data.tags["stack_on"] == str(a)
    assert run.data.metrics["before.spec.mape"] == pytest.approx(parked_after["spec"]["mape"])
    fp32(cli.repo)
    assert cli("gate")[0] == 0
    code, out, err = cli("admit")
    assert code == 0, out + err
    assert f"admitted iterations {a}, {b}" in out
    g1 = golden(cli)
    assert g1["admitted"]["iteration"] == b
    ra, rb = latest(cli, a), latest(cli, b)
    assert ra["outcome"] == rb["outcome"] == "landed" and ra["stack"] == rb["stack"] == [a, b]
    assert close(ra["before"], g0["aggregates"]), "the bottom member is measured against the old golden file"
    assert close(ra["after"], rb["before"]), "each member's before is the tree with the members below it"
    assert close(rb["after"], g1["aggregates"])
    for r in (ra, rb):
        assert r["after"]["link_calibrated"]["mape"] < r["before"]["link_calibrated"]["mape"]
    assert (cli.repo / "autoresearch" / ra["patch"]).is_file(), "a landed member keeps its patch as history"
    book = cli.ledger()
    assert book.get_run(ra["run_id"]).data.tags["outcome"] == "landed"
    assert book.get_run(ra["run_id"]).info.status == "FINISHED"
    assert book.open_iteration() is None
    log = (cli.repo / "autoresearch" / "LOG.md").read_text()
    assert f"## Iteration {a}: landed" in log and f"it{a} + it{b}" in log


def test_a_member_that_rides_along_is_refused(cli):
    a = park_a(cli)
    propose(cli, "h100 mtbf", "--on", str(a))
    edit(cli.repo, "hops/presets/devices.yaml", "mtbf_hours: 50000", "mtbf_hours: 40000")  # moves no score
    with open(cli.repo / "autoresearch" / "citations.yaml", "a") as fh:
        fh.write("  - {path: devices.h100.mtbf_hours, value: 40000, source: fleet log, kind: measurement}\n")
    assert cli("gate")[0] == 0, "the stacked tree passes the gate: only the member rule can refuse it"
    before = golden(cli)
    code, out, _ = cli("admit")
    assert code == 1 and "nothing rides along" in out and "improves no gated aggregate" in out
    assert golden(cli) == before and cli.ledger().open_iteration() is not None


def test_revert_drops_a_stack_and_keeps_its_patches(cli):
    a = park_a(cli)
    b = propose(cli, "fp32 embedding grads", "--on", str(a))
    fp32(cli.repo)
    code, out, err = cli("revert", "--reason", "try it the other way round")
    assert code == 0, out + err
    assert dirty(cli) == [], "the stack's patches and the top's change are all off the tree"
    assert latest(cli, a)["outcome"] == "parked" and (cli.repo / "autoresearch" / latest(cli, a)["patch"]).is_file()
    rb = latest(cli, b)
    assert rb["outcome"] == "reverted" and rb["stack_on"] == [a]
    assert "embedding_grad_bytes_per_element: 4" in (cli.repo / "autoresearch" / rb["patch"]).read_text()
    assert "+tied_embeddings" not in (cli.repo / "autoresearch" / rb["patch"]).read_text(), \
        "a stacked iteration's patch holds its own change only"
    arscratch.commit(cli.repo, "reverted")
    propose(cli, "again", "--on", str(a))  # the parked patch still applies
    assert cli("revert", "--reason", "test")[0] == 0


def _fake_parked(cli, numbers, stack_on=None) -> None:
    """Parked records + patches as a previous session would have committed them (each adds one file)."""
    with open(cli.repo / "autoresearch" / "iterations.jsonl", "a") as fh:
        for k, n in enumerate(numbers):
            name = f"patches/it{n}-file-{n}.patch"
            body = f"file {n}\n"
            patch = (f"diff --git a/docs/stack{n}.txt b/docs/stack{n}.txt\nnew file mode 100644\n--- /dev/null\n"
                     f"+++ b/docs/stack{n}.txt\n@@ -0,0 +1 @@\n+{body}")
            (cli.repo / "autoresearch" / "patches").mkdir(exist_ok=True)
            (cli.repo / "autoresearch" / name).write_text(patch)
            fh.write(json.dumps({"iteration": n, "run_id": f"elsewhere-{n}", "outcome": "parked", "patch": name,
                                 "title": f"file {n}", "hypothesis": f"file {n}", "before": {}, "after": None,
                                 "stack_on": (stack_on or {}).get(n, [])}) + "\n")
    arscratch.commit(cli.repo, "parked elsewhere")


def test_a_stack_has_at_most_four_members(cli):
    _fake_parked(cli, [11, 12, 13, 14, 15], stack_on={12: [11]})
    code, _, err = cli("propose", "--hypothesis", "h", "--change-site", MODEL, "--expect", "e",
                       "--on", "11,12,13,14,15")
    assert code == 2 and "at most 4 members" in err
    code, _, err = cli("propose", "--hypothesis", "h", "--change-site", MODEL, "--expect", "e", "--on", "12,13,14,15")
    assert code == 2 and "at most 4" in err, "--on 12 brings the iteration it was parked on (11) along"
    n = propose(cli, "fifth", "--on", "12,13,14")  # expands to 11, 12, 13, 14
    assert cli.ledger().open_iteration().data.tags["stack_on"] == "11,12,13,14"
    assert all((cli.repo / "docs" / f"stack{k}.txt").is_file() for k in (11, 12, 13, 14))
    tie(cli.repo)
    assert cli("gate")[0] == 0
    code, _, err = cli("park")
    assert code == 2 and "at most 4 members; this one would have 5" in err
    code, out, err = cli("admit")
    assert code == 2 and "at most 4 members" in err
    assert cli("revert", "--reason", "too tall")[0] == 0 and latest(cli, n)["outcome"] == "reverted"
    assert dirty(cli) == []


def test_propose_on_needs_parked_iterations_and_a_clean_tree(cli):
    code, _, err = cli("propose", "--hypothesis", "h", "--change-site", MODEL, "--expect", "e", "--on", "1")
    assert code == 2 and "iteration 1 is landed, not parked" in err
    code, _, err = cli("propose", "--hypothesis", "h", "--change-site", MODEL, "--expect", "e", "--on", "x")
    assert code == 2 and "expected iteration numbers" in err
    a = park_a(cli)
    edit(cli.repo, "README.md", "HOPS", "HOPS (edited)")
    code, _, err = cli("propose", "--hypothesis", "h", "--change-site", MODEL, "--expect", "e", "--on", str(a))
    assert code == 2 and "uncommitted changes" in err
    assert cli.ledger().open_iteration() is None


# --------------------------------------------------------------------------- the user's untracked files
def users_files(cli) -> dict:
    """What a user has lying around untracked when an iteration opens: a plug-in, a report, a scratch directory."""
    files = {"my_schedulers.py": "class Mine: ...\n", "out.json": "{}\n", "scratch/notes.txt": "mine\n"}
    for rel, text in files.items():
        (cli.repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (cli.repo / rel).write_text(text)
    return files


def test_files_untracked_before_propose_stay_the_users_revert_keeps_them_and_the_patch_leaves_them_out(cli):
    files = users_files(cli)
    n = propose(cli, "tie embeddings")
    tie(cli.repo)
    (cli.repo / "docs" / "note-it.md").write_text("a file created after propose belongs to the change\n")
    files["my_schedulers.py"] = "class Mine: ...  # edited while the iteration was open\n"
    (cli.repo / "my_schedulers.py").write_text(files["my_schedulers.py"])
    code, out, err = cli("revert", "--reason", "QA test")
    assert code == 0, out + err
    for rel, text in files.items():
        assert (cli.repo / rel).read_text() == text, f"revert removed or reset the user's {rel}"
    assert sorted(dirty(cli)) == sorted(files), "the iteration's own change is off the tree, the user's files stay"
    patch = (cli.repo / "autoresearch" / latest(cli, n)["patch"]).read_text()
    assert "tied_embeddings: true" in patch and "docs/note-it.md" in patch
    for rel in files:
        assert rel not in patch, f"the user's {rel} is in the iteration's patch"


def test_park_and_a_stack_carrier_admit_leave_files_untracked_before_propose_alone(cli):
    files = users_files(cli)
    a = propose(cli, "tie embeddings")
    tie(cli.repo)
    assert cli("gate")[0] == 0
    (cli.repo / "out.json").write_text('{"rewritten": "after the gate"}\n')  # the user's: not the judged tree
    files["out.json"] = '{"rewritten": "after the gate"}\n'
    code, out, err = cli("park")
    assert code == 0, out + err
    assert all((cli.repo / rel).read_text() == text for rel, text in files.items())
    assert not any(rel in (cli.repo / "autoresearch" / latest(cli, a)["patch"]).read_text() for rel in files)
    arscratch.git(cli.repo, "add", "autoresearch")
    arscratch.git(cli.repo, "commit", "-q", "-m", f"park it{a}")
    propose(cli, "carry it", "--on", str(a))  # the user's untracked files are no uncommitted change
    assert cli("gate")[0] == 0
    code, out, err = cli("admit")
    assert code == 0, out + err
    assert f"admitted iterations {a}:" in out, "the carrier changes nothing of its own: it is no stack member"
    assert latest(cli, a)["outcome"] == "landed"
    assert all((cli.repo / rel).read_text() == text for rel, text in files.items())
