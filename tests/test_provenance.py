"""One declared list of model files; one model fingerprint in summary.json, the ledger, golden and checkpoints.

hops.provenance.MODEL_FILES is the list. These specifications keep every
consumer derived from it: each hops/ module is either declared or listed here
as not moving predictions (so a new module such as hops/model/collectives.py cannot
slip through), every module the model imports is declared, the pre-commit
hook selects files from the list at commit time, and the fingerprint ignores
comments and docstrings but not code or constants.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from autoresearch import ledger
from autoresearch.gate import GATE_FILES, needs_gate
from hops import Catalog, provenance, simulate

REPO = Path(__file__).resolve().parents[1]
SCENARIO = REPO / "conf" / "scenario" / "hetero_pp4.yaml"
# hops/ files that cannot move a prediction, each with the reason
NOT_MODEL = {
    "hops/__init__.py": "re-exports only",
    "hops/errors.py": "exception types",
    "hops/provenance.py": "this list and the fingerprint",
    "hops/run/__init__.py": "the app's package docstring",
    "hops/run/__main__.py": "`python -m hops.run`",
    "hops/run/app.py": "Hydra app: composes a scenario and writes outputs",
    "hops/run/charts_alongside.py": "draws a run's PNG outputs in a forked child",
    "hops/run/run_dir.py": "locks a run's output directory and sets the previous run's files aside",
    "hops/run/sweep.py": "reports on finished runs",
    "hops/run/file_deletions.py": "hands a scenario_file run's ~key overrides through Hydra",
    "hops/outputs/__init__.py": "lazy access to the writers",
    "hops/outputs/chrome_trace.py": "an output format of a finished timeline",
    "hops/outputs/files.py": "atomic writers and formats of finished results",
    "hops/outputs/text_columns.py": "prints the columns of a finished timeline (events.csv, trace.json)",
    "hops/run/mlflow_runs.py": "Hydra callback logging finished runs to MLflow",
    "hops/run/progress.py": "progress lines on a terminal",
    "hops/run/tracking.py": "checks that an MLflow tracking server answers",
    "hops/run/launchers.py": "checks that a Ray cluster answers before a sweep",
    "hops/planner.py": "placement and 3D planners; not imported by simulate",
    "hops/plan.py": "command line of the 3D planner",
    "hops/outputs/plots/__init__.py": "plots",
    "hops/outputs/plots/dashboard.py": "plots",
    "hops/outputs/plots/progress.py": "progress bar",
    "hops/outputs/plots/timeline_plot.py": "plots",
}


def test_every_hops_module_is_declared_a_model_file_or_known_not_to_be_one():
    files = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "hops").rglob("*.py"))
    undeclared = [f for f in files if not provenance.is_model_file(f) and f not in NOT_MODEL]
    assert undeclared == [], "declare these in hops.provenance.MODEL_FILES (or in NOT_MODEL with a reason)"
    assert provenance.is_model_file("hops/model/collectives.py")
    assert not any(provenance.is_model_file(f) for f in NOT_MODEL)
    assert all(provenance.is_model_file(f"hops/presets/{p.name}") for p in (REPO / "hops" / "presets").glob("*.yaml"))


def test_every_module_the_model_imports_is_declared():
    code = ("import sys, hops, hops.failures, autoresearch.validate, autoresearch.variants; "
            f"hops.simulate({str(SCENARIO)!r}); "
            "print('\\n'.join(sorted(m.__file__ for n, m in sys.modules.items() "
            "if n.split('.')[0] in ('hops', 'autoresearch') and getattr(m, '__file__', None))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    loaded = [Path(f).resolve().relative_to(REPO).as_posix() for f in out.split()]
    assert "hops/model/collectives.py" in loaded
    missing = [f for f in loaded if not provenance.is_model_file(f) and f not in NOT_MODEL
               and f != "autoresearch/__init__.py"]
    assert missing == []


def _copy_model(dst: Path) -> Path:
    for p in provenance.model_files(REPO):
        (dst / p.relative_to(REPO)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(p, dst / p.relative_to(REPO))
    return dst


def test_fingerprint_ignores_comments_and_docstrings_but_not_code(tmp_path):
    root = _copy_model(tmp_path)
    base = provenance.code_fingerprint(root)
    assert base == provenance.code_fingerprint(REPO)
    f = root / "hops" / "model" / "collectives.py"
    src = f.read_text()
    f.write_text("# a comment that changes nothing\n" + src.replace('"""', '"""Reworded. ', 1) + "\n# end\n")
    assert provenance.code_fingerprint(root) == base, "comments and docstrings cannot buy a new fingerprint"
    f.write_text(src + "\nEXTRA_SYNC_FACTOR = 3\n")
    assert provenance.code_fingerprint(root) != base


def test_the_disk_cache_gives_the_parsed_value_and_is_keyed_on_the_files_bytes(tmp_path, monkeypatch):
    """A new process reads the code fingerprint from disk instead of parsing ~40 ASTs (~0.5 s)."""
    root = _copy_model(tmp_path / "tree")
    monkeypatch.setenv(provenance.CACHE_ENV, "")  # off: parsed
    parsed = provenance.code_fingerprint(root)
    monkeypatch.setenv(provenance.CACHE_ENV, str(tmp_path / "cache"))
    provenance._code_hash.cache_clear()  # as a new process
    assert provenance.code_fingerprint(root) == parsed  # parsed, and written
    (entry,) = (tmp_path / "cache" / "fingerprints").iterdir()
    provenance._code_hash.cache_clear()

    def no_parsing(*_):
        raise AssertionError("parsed although the cache holds this tree")

    with monkeypatch.context() as m:
        m.setattr(provenance, "code_digest", no_parsing)
        assert provenance.code_fingerprint(root) == parsed  # read from the cache
    f = root / "hops" / "model" / "collectives.py"
    stat = f.stat()
    f.write_text(f.read_text().replace("def ", "def _", 1))  # same size would not matter: the bytes are the key
    os.utime(f, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    provenance._code_hash.cache_clear()
    assert provenance.code_fingerprint(root) != parsed
    assert len(list((tmp_path / "cache" / "fingerprints").iterdir())) == 2
    entry.write_text("not a hash")  # a damaged entry is parsed again, never trusted
    f.write_text(f.read_text().replace("def _", "def ", 1))
    os.utime(f, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    provenance._code_hash.cache_clear()
    assert provenance.code_fingerprint(root) == parsed


def test_summary_json_and_the_ledger_carry_the_same_fingerprint():
    assert simulate(str(SCENARIO)).summary["model_fingerprint"] == ledger.model_fingerprint()
    cat = Catalog.load({"stacks.fixture_megatron.k_floor_ms.h100": 1.2})
    fp = simulate(str(SCENARIO), catalog=cat).summary["model_fingerprint"]
    assert fp == ledger.model_fingerprint({"stacks.fixture_megatron.k_floor_ms.h100": 1.2}) == ledger.model_fingerprint(["stacks.fixture_megatron.k_floor_ms.h100=1.2"])
    assert fp != ledger.model_fingerprint()
    assert ledger.provenance("train", ["spec"])["model_fingerprint"] == ledger.model_fingerprint()


def test_the_pre_commit_hook_selects_files_from_the_declared_lists():
    doc = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())
    hook = next(h for repo in doc["repos"] for h in repo["hooks"] if "autoresearch" in h["entry"])
    assert hook["entry"].startswith("python -m autoresearch precommit")
    assert hook["pass_filenames"] is True and hook["always_run"] is True and "files" not in hook
    model = [p.relative_to(REPO).as_posix() for p in provenance.model_files(REPO)]
    assert "hops/model/collectives.py" in model and "hops/presets/model.yaml" in model
    gate = ["autoresearch/gate.yaml", "autoresearch/citations.yaml", "autoresearch/golden/train.json",
            "autoresearch/search_space.yaml", "autoresearch/gate.py"]
    assert needs_gate(model + gate) == model + gate
    assert needs_gate(["README.md", "experiments/hetero_scheduler/run.py", "hops/outputs/plots/dashboard.py",
                       "autoresearch/golden/sub/x.json", "tests/test_engine_physics.py"]) == []
    assert set(GATE_FILES) >= {"autoresearch/gate.yaml", "autoresearch/golden/*.json"}


def test_precommit_skips_the_gate_without_model_files_and_runs_it_with_one(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOPS_FIXTURES": str(tmp_path / "nowhere"), "HOME": str(tmp_path),
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'l.db'}", "HOPS_AUTORESEARCH_STATE": str(tmp_path)}
    run = lambda *files: subprocess.run([sys.executable, "-m", "autoresearch", "precommit", *files], cwd=REPO,
                                        env=env, capture_output=True, text=True)
    p = run("README.md", "docs/failures.md")
    assert p.returncode == 0 and "gate skipped" in p.stdout
    p = run("README.md", "hops/model/collectives.py")  # the gate runs (and here finds no fixtures to judge by)
    assert "running the gate" in p.stdout and p.returncode == 2 and "HOPS_FIXTURES" in p.stderr
