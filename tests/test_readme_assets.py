"""README's sample output, timeline image and calibration table are what the code produces now."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_readme_figures_are_regenerated_from_the_current_code():
    proc = subprocess.run([sys.executable, "docs/make_readme_assets.py", "--check"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, (proc.stdout + proc.stderr + "\nrun: python docs/make_readme_assets.py")
