"""SIGKILL at chosen write points leaves the calibration state consistent, and the next command finishes the job.

`HOPS_AUTORESEARCH_KILL_AT=<point>` makes the CLI kill itself there
(autoresearch.ledger.crash_point): between the steps of admit and revert
(journal written, golden/patch written, jsonl appended, MLflow closed, LOG.md
written, tree restored) and inside an atomic write between the temp file and
the rename. After the kill the next command (revert after a killed admit,
the issue's failing case; propose after a killed revert) must first complete
the interrupted one: one record, the new golden file, the outcome in MLflow,
a full LOG.md, no journal left behind.
"""
import json

import pytest

import arscratch
from arscratch import cli, dirty, golden, latest, propose, records, template, tie  # cli, template: pytest fixtures

KILLED = -9


def state(cli):
    return cli.repo / "autoresearch"


@pytest.mark.parametrize("point", ["write:train.json", "admit:append", "admit:mlflow", "write:LOG.md"])
def test_a_killed_admit_is_completed_by_the_next_command(cli, point):
    g0 = golden(cli)
    n = propose(cli, "tie embeddings")
    tie(cli.repo)
    code, out, err = cli("admit", kill_at=point)
    assert code == KILLED, out + err
    code, out, err = cli("revert", "--reason", "changed my mind after the crash")
    assert code == 2 and "no open iteration" in err, out + err
    assert "completed an interrupted `admit`" in err
    g1 = golden(cli)
    assert g1["admitted"]["iteration"] == n and g1 != g0, "the golden file is the admitted iteration's"
    from autoresearch.gate import checksum

    assert g1["checksum"] == checksum(g1)
    mine = [r for r in records(cli) if r["iteration"] == n]
    assert [r["outcome"] for r in mine] == ["landed"], "exactly one record, no duplicate line"
    assert mine[0]["after"]["spec"]["mape"] == pytest.approx(g1["aggregates"]["spec"]["mape"])
    log = (state(cli) / "LOG.md").read_text()
    assert f"## Iteration {n}: landed" in log
    run = cli.ledger().get_run(mine[0]["run_id"])
    assert run.data.tags["outcome"] == "landed" and run.info.status == "FINISHED"
    assert not (state(cli) / ".pending.json").exists()


@pytest.mark.parametrize("point", ["write:it2-tie-embeddings.patch", "revert:restore"])
def test_a_killed_revert_keeps_the_diff_and_is_completed_by_the_next_command(cli, point):
    n = propose(cli, "tie embeddings")
    tie(cli.repo)
    assert n == 2
    code, out, err = cli("revert", "--reason", "gate says no", kill_at=point)
    assert code == KILLED, out + err
    m = propose(cli, "next idea")
    assert m == n + 1
    rec = latest(cli, n)
    assert rec["outcome"] == "reverted" and [r["iteration"] for r in records(cli)].count(n) == 1
    assert "+tied_embeddings: true" in (state(cli) / rec["patch"]).read_text()
    assert dirty(cli) == [], "the tree was restored once the diff was safe"
    assert cli.ledger().get_run(rec["run_id"]).data.tags["outcome"] == "reverted"
    assert cli("revert", "--reason", "cleanup")[0] == 0


def test_a_kill_inside_a_state_write_leaves_the_old_bytes(cli):
    log = state(cli) / "LOG.md"
    jsonl = state(cli) / "iterations.jsonl"
    old_log, old_jsonl = log.read_text(), jsonl.read_text()
    assert old_log.strip() and old_jsonl.strip()
    assert cli("log", kill_at="write:LOG.md")[0] == KILLED
    assert log.read_text() == old_log, "a kill between temp file and rename never leaves LOG.md empty"
    propose(cli, "tie embeddings")
    code, _, _ = cli("revert", "--reason", "x", kill_at="write:iterations.jsonl")
    assert code == KILLED and jsonl.read_text() == old_jsonl
    assert cli("log")[0] == 0  # replays the revert: the line is added once
    assert len(jsonl.read_text().splitlines()) == len(old_jsonl.splitlines()) + 1
    assert all(json.loads(x) for x in jsonl.read_text().splitlines())


def test_a_kill_while_recording_a_checkpoint_leaves_checkpoints_json_whole(cli, tmp_path, fixtures_root):
    root = tmp_path / "with_test"
    arscratch.link_fixtures(fixtures_root, root, (), arscratch.DIAGNOSTIC)
    for fid in arscratch.TRAIN:  # a synthetic held-out split made of real traces
        dst = root / "test" / "cluster_results" / fid
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.symlink_to(fixtures_root / "train" / "cluster_results" / fid)
    path = state(cli) / "checkpoints.json"
    earlier = [{"model_fingerprint": "0" * 16, "date": "2026-01-01T00:00:00Z", "reason": "earlier", "aggregates": {}}]
    path.write_text(json.dumps(earlier) + "\n")
    code, _, err = cli("checkpoint", "--split", "test", "--confirm-human", "review", "--fixtures", str(root),
                       kill_at="write:checkpoints.json")
    assert code == KILLED, err
    assert json.loads(path.read_text()) == earlier, "the old list survives; it is never truncated first"
    code, _, err = cli("checkpoint", "--split", "test", "--confirm-human", "review", "--fixtures", str(root))
    assert code == 0, err
    assert [r["reason"] for r in json.loads(path.read_text())] == ["earlier", "review"]
    assert not list(state(cli).rglob(".*.tmp-*")), "the killed writer's temp file is swept by the next command"
