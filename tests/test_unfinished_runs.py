"""A run is marked complete only once its effect is durable; `repair` closes what a kill left behind.

Killed at the points below, the ledger used to hold records that looked complete and were not:
- propose killed right after creating its run: an open iteration without a baseline, whose
  committed record later read `"before": {}` and LOG.md `n/a -> 4.21`;
- admit killed right after its run was FINISHED: a FINISHED run tagged gate=pass while nothing
  was admitted, and the retry added a second FINISHED admit run;
- gate killed right after creating its run: a run RUNNING forever, tagged gate=pass, no metrics;
and `repair` said "nothing to repair" for all three.
"""
import pytest

import arscratch
from arscratch import cli, golden, latest, propose, records, template, tie  # cli, template: pytest fixtures

KILLED = -9


def runs(cli, run_type, iteration=None):
    """The scratch ledger's runs of one type (of one iteration: the template holds the bootstrap's)."""
    from autoresearch import ledger

    found = cli.ledger().runs(ledger.CALIBRATION, f"tags.run_type = '{run_type}'")
    return [r for r in found if iteration is None or r.data.tags.get("iteration") == str(iteration)]


def test_a_propose_killed_after_creating_its_run_opens_nothing(cli):
    g = golden(cli)
    code, out, err = cli("propose", "--hypothesis", "tie: x", "--change-site", arscratch.MODEL, "--expect", "down",
                         "--title", "tie", kill_at="propose:created")
    assert code == KILLED, out + err
    [half] = [r for r in runs(cli, "iteration") if r.data.tags["title"] == "tie"]
    assert half.data.tags["outcome"] == "void" and half.info.status == "RUNNING"
    code, out, err = cli("revert", "--reason", "x")
    assert code == 2 and "no open iteration" in err, "the half-made iteration is not open"
    code, out, err = cli("repair")
    assert code == 0 and f"iteration {half.data.tags['iteration']} (void: propose was killed" in out, out + err
    half = cli.ledger().get_run(half.info.run_id)
    assert half.info.status == "KILLED" and half.data.tags["incomplete"]
    assert "nothing to repair" in cli("repair")[1]
    # the retry is a whole iteration: its record and the log carry the baseline
    n = propose(cli, "tie again")
    tie(cli.repo)
    assert cli("gate")[0] == 0
    assert cli("revert", "--reason", "checking the record")[0] == 0
    rec = latest(cli, n)
    assert rec["before"]["spec"]["mape"] == pytest.approx(g["aggregates"]["spec"]["mape"])
    section = (cli.repo / "autoresearch" / "LOG.md").read_text().split(f"## Iteration {n}: ")[1].split("\n## ")[0]
    assert "→" in section and "n/a" not in section, section


def test_an_admit_killed_before_its_journal_leaves_no_finished_admit_run(cli):
    n = propose(cli, "tie embeddings")
    tie(cli.repo)
    code, out, err = cli("admit", kill_at="admit:gate_logged")
    assert code == KILLED, out + err
    [first] = runs(cli, "admit", n)
    assert first.info.status == "RUNNING", "not FINISHED: nothing was admitted"
    assert [r["iteration"] for r in records(cli)].count(n) == 0
    code, out, err = cli("admit")
    assert code == 0, out + err
    code, out, err = cli("repair")
    assert code == 0 and "admit run" in out and "closed as KILLED, tagged incomplete" in out, out + err
    by_status = {r.info.run_id: (r.info.status, r.data.tags.get("gate")) for r in runs(cli, "admit", n)}
    assert sorted(by_status.values()) == [("FINISHED", "pass"), ("KILLED", "incomplete")], by_status
    assert by_status[first.info.run_id] == ("KILLED", "incomplete")
    assert [r["outcome"] for r in records(cli) if r["iteration"] == n] == ["landed"]


def test_an_admit_killed_after_its_journal_is_finished_by_the_next_command(cli):
    n = propose(cli, "tie embeddings")
    tie(cli.repo)
    code, out, err = cli("admit", kill_at="admit:log")  # every effect but LOG.md done, the admit run FINISHED
    assert code == KILLED, out + err
    code, out, err = cli("repair")
    assert code == 0 and "completed an interrupted `admit`" in out + err, out + err
    [admit] = runs(cli, "admit", n)
    assert (admit.info.status, admit.data.tags["gate"]) == ("FINISHED", "pass")
    assert latest(cli, n)["outcome"] == "landed"


def test_a_gate_killed_after_creating_its_run_is_closed_by_repair_not_left_running_as_a_pass(cli):
    from autoresearch import ledger

    n = propose(cli, "tie embeddings")
    tie(cli.repo)
    code, out, err = cli("gate", kill_at="gate:created")
    assert code == KILLED, out + err
    [half] = runs(cli, "gate", n)
    assert half.info.status == "RUNNING" and "gate" not in half.data.tags, "no verdict without the numbers"
    assert not half.data.metrics
    code, out, err = cli("repair")
    assert code == 0 and "gate run" in out and "tagged incomplete" in out, out + err
    half = cli.ledger().get_run(half.info.run_id)
    assert half.info.status == "KILLED" and half.data.tags["gate"] == "incomplete"
    assert half.data.tags["incomplete"] == "its command was killed before it finished; not a result (closed by repair)"
    assert "nothing to repair" in cli("repair")[1]
    # a whole gate afterwards is FINISHED with its verdict and numbers
    assert cli("gate")[0] == 0
    whole = [r for r in runs(cli, "gate", n) if r.info.run_id != half.info.run_id]
    assert [(r.info.status, r.data.tags["gate"]) for r in whole] == [("FINISHED", "pass")]
    assert whole[0].data.metrics["gate.violations"] == 0
    assert ledger.WRITER in whole[0].data.tags


def test_a_running_gate_of_a_live_process_is_left_alone(cli):
    """repair runs under the state lock, but `gate` does not take it: a live writer's run is not stale."""
    from autoresearch import ledger, unfinished

    book = cli.ledger()
    live = book.start_run(ledger.CALIBRATION, "gate", run_type="gate")  # this test process is its writer
    assert unfinished._close_dead_runs(book) == []
    assert book.get_run(live).info.status == "RUNNING"


def test_repair_gives_an_old_baseline_less_open_iteration_the_golden_baseline(cli):
    """A ledger from before the fix: an open iteration whose propose died before logging `before.*`."""
    from autoresearch import ledger

    g = golden(cli)
    book = cli.ledger()
    n = book.next_iteration()
    run = book.start_run(ledger.CALIBRATION, f"it{n} iteration: old", run_type="iteration",
                         tags={"iteration": n, "title": "old", "hypothesis": "h", "change_site": arscratch.MODEL,
                               "expected_effect": "e", "outcome": "open", "opened": ledger.now()})
    code, out, err = cli("repair")
    assert code == 0 and f"iteration {n}: had no baseline; recorded the golden file's" in out, out + err
    assert book.get_run(run).data.metrics["before.spec.mape"] == pytest.approx(g["aggregates"]["spec"]["mape"])
    tie(cli.repo)
    assert cli("gate")[0] == 0 and cli("revert", "--reason", "x")[0] == 0
    assert latest(cli, n)["before"]["spec"]["mape"] == pytest.approx(g["aggregates"]["spec"]["mape"])


def test_an_old_open_iteration_whose_baseline_cannot_be_recovered_is_marked_and_kept_open(cli):
    """When the golden file is not provably its baseline (it was admitted at or after the iteration's
    number), repair does not invent one and does not throw the open work away: it tags it."""
    from autoresearch import ledger

    book = cli.ledger()
    run = book.start_run(ledger.CALIBRATION, "it1 iteration: old", run_type="iteration",
                         tags={"iteration": 1, "title": "old", "hypothesis": "h", "change_site": arscratch.MODEL,
                               "expected_effect": "e", "outcome": "open", "opened": ledger.now()})
    code, out, err = cli("repair")
    assert code == 0 and "iteration 1: open without a baseline that can be recovered; tagged baseline_missing" in out
    after = book.get_run(run)
    assert after.data.tags["outcome"] == "open" and after.data.tags["baseline_missing"]
    assert not any(k.startswith("before.") for k in after.data.metrics)
    assert "nothing to repair" in cli("repair")[1]
