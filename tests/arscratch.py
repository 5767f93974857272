"""A throw-away copy of this repository for tests of commands that edit the working tree.

park, revert and `propose --on` restore and patch the git working tree, so
they are exercised on a scratch git repository holding this checkout's files
(the real, uncommitted tree included), never on the repository itself. The CLI
runs as a subprocess inside the copy (PYTHONPATH points at it), so the model
it scores is the copy's code and presets, exactly as for a user.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

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


def link_fixtures(fixtures_root: Path, root: Path, train: tuple[str, ...], diagnostic: str) -> Path:
    for split, ids in (("train", train), ("diagnostic", (diagnostic,))):
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
