"""A throw-away copy of this repository for tests of commands that edit the working tree.

park, revert and `propose --on` restore and patch the git working tree, so
they are exercised on a scratch git repository holding this checkout's files
(the real, uncommitted tree included), never on the repository itself. The CLI
runs as a subprocess inside the copy (PYTHONPATH points at it), so the model
it scores is the copy's code and presets, exactly as for a user.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STATE = ("autoresearch/iterations.jsonl", "autoresearch/LOG.md", "autoresearch/checkpoints.json")


def git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True)
    return out.stdout


def copy_repo(dest: Path) -> Path:
    """This checkout's tracked + untracked files (minus calibration state) as a fresh one-commit repository."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if rel in STATE or rel.startswith(("autoresearch/golden/", "autoresearch/patches/")) or not src.is_file():
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)
    git(dest, "init", "-q", "-b", "main")
    git(dest, "config", "user.email", "test@hops.invalid")
    git(dest, "config", "user.name", "hops test")
    commit(dest, "scratch copy")
    return dest


def commit(repo: Path, message: str) -> None:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", message)


def link_fixtures(fixtures_root: Path, root: Path, train: tuple[str, ...], diagnostic: str,
                  archive: tuple[str, ...] = ()) -> Path:
    for split, ids in (("train", train), ("diagnostic", (diagnostic,)), ("archive", archive)):
        for fid in ids:
            dst = root / split / "cluster_results" / fid
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.symlink_to(fixtures_root / split / "cluster_results" / fid)
    return root


class Cli:
    """`python -m autoresearch ...` run inside a scratch repo with its own ledger."""

    def __init__(self, repo: Path, ledger_db: Path, fixtures: Path):
        self.repo, self.db, self.fixtures = repo, ledger_db, fixtures

    def env(self, **extra: str) -> dict:
        env = {k: v for k, v in os.environ.items() if k not in ("HOPS_AUTORESEARCH_STATE", "PYTHONPATH")}
        env.update(PYTHONPATH=str(self.repo), MLFLOW_TRACKING_URI=f"sqlite:///{self.db}",
                   HOPS_FIXTURES=str(self.fixtures), MPLBACKEND="Agg", **extra)
        return env

    def __call__(self, *argv: str, kill_at: str | None = None, timeout: int = 600) -> tuple[int, str, str]:
        env = self.env(**({"HOPS_AUTORESEARCH_KILL_AT": kill_at} if kill_at else {}))
        p = subprocess.run([sys.executable, "-m", "autoresearch", *argv], cwd=self.repo, env=env,
                           capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr

    def popen(self, *argv: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "autoresearch", *argv], cwd=self.repo, env=self.env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def ledger(self):
        """An in-process view of the scratch ledger and state (reads only)."""
        from autoresearch import ledger

        return ledger.Ledger(f"sqlite:///{self.db}")


def clone(template: Path, template_db: Path, fixtures: Path, dest: Path) -> Cli:
    """A cheap per-test copy: git clone of the template repo and a copy of its migrated ledger."""
    subprocess.run(["git", "clone", "-q", str(template), str(dest / "repo")], check=True, capture_output=True)
    repo = dest / "repo"
    git(repo, "config", "user.email", "test@hops.invalid")
    git(repo, "config", "user.name", "hops test")
    (dest / "ledger").mkdir()
    for f in template_db.parent.iterdir():
        if f.is_file() and f.name.startswith(template_db.name) and not f.name.endswith(".lock"):
            shutil.copy2(f, dest / "ledger" / f.name)
    art = template_db.parent / "artifacts"
    if art.is_dir():
        shutil.copytree(art, dest / "ledger" / "artifacts")
    return Cli(repo, dest / "ledger" / template_db.name, fixtures)


# --------------------------------------------------------------------------- a model two corrections behind
TRAIN = ("exp2_13_a10g_pair_pp2_run135", "exp2_14_l4_pair_pp2_run137")
DIAGNOSTIC = "exp3_47_diag_pp3_gpipe_a10g_h100_l4_run371"
MODEL = "hops/presets/model.yaml"


def edit(repo: Path, rel: str, old: str, new: str) -> None:
    f = repo / rel
    text = f.read_text()
    assert old in text, (rel, old)
    f.write_text(text.replace(old, new, 1))


def tie(repo: Path) -> None:
    """Correction A: Megatron ties the input and output embeddings (their gradients are all-reduced)."""
    edit(repo, MODEL, "tied_embeddings: false", "tied_embeddings: true")


def fp32(repo: Path) -> None:
    """Correction B: those gradients are all-reduced in fp32."""
    edit(repo, MODEL, "embedding_grad_bytes_per_element: 2", "embedding_grad_bytes_per_element: 4")


def make_template(fixtures_root: Path, base: Path) -> Cli:
    """A scratch repo whose model lacks corrections A and B, its golden file bootstrapped and committed.

    Restoring either correction is a measured improvement of every gated aggregate on the two
    fixtures, so tests can park, stack and land real changes.
    """
    repo = copy_repo(base / "repo")
    edit(repo, MODEL, "tied_embeddings: true", "tied_embeddings: false")
    edit(repo, MODEL, "embedding_grad_bytes_per_element: 4", "embedding_grad_bytes_per_element: 2")
    commit(repo, "a model two corrections behind")
    root = link_fixtures(fixtures_root, base / "fixtures", TRAIN, DIAGNOSTIC)
    cli = Cli(repo, base / "ledger" / "mlflow.db", root)
    code, out, err = cli("admit", "--bootstrap")
    assert code == 0, out + err
    commit(repo, "golden file")
    return cli


# --------------------------------------------------------------------------- reading a scratch repo's state
def propose(cli, title, *extra):
    code, out, err = cli("propose", "--hypothesis", f"{title}: a physical correction", "--change-site", MODEL,
                         "--expect", "MAPE and bubble MAE down", "--title", title, *extra)
    assert code == 0, out + err
    return int(re.search(r"opened iteration (\d+)", out).group(1))


def records(cli) -> list[dict]:
    p = cli.repo / "autoresearch" / "iterations.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()]


def latest(cli, n: int) -> dict:
    return [r for r in records(cli) if r["iteration"] == n][-1]


def dirty(cli) -> list[str]:
    """Paths changed against HEAD that are not calibration state."""
    lines = git(cli.repo, "status", "--porcelain", "--untracked-files=all").splitlines()
    state = ("autoresearch/iterations.jsonl", "autoresearch/LOG.md", "autoresearch/golden/", "autoresearch/patches/")
    return [x[3:] for x in lines if not x[3:].startswith(state)]


def golden(cli) -> dict:
    return json.loads((cli.repo / "autoresearch" / "golden" / "train.json").read_text())


# The two fixtures of every test module that drives the CLI on a scratch repository: the
# bootstrap (golden file, ledger) is built once per module, each test gets its own clone.
# A module takes them with `from arscratch import cli, template`.
@pytest.fixture(scope="module")
def template(fixtures_root, tmp_path_factory):
    return make_template(fixtures_root, tmp_path_factory.mktemp("scratch-template"))


@pytest.fixture
def cli(template, tmp_path):
    return clone(template.repo, template.db, template.fixtures, tmp_path)
