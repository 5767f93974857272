"""Same scenario and seed: the same bytes. Another seed with jitter: other numbers."""
import hops
from builders import pipeline


def outputs(tmp, seed, jitter=0.2):
    sc = pipeline(4, 8, jitter=jitter, hop_ms=0.3, batches=2)
    sc["pipeline"]["compute_jitter"] = 0.1
    for st in sc["pipeline"]["stages"]:
        st["compute"] = {"mode": "analytical", "tflop": 0.06, "memory_mb": 128}
    sc["pipeline"]["model"] = {"hidden_dim": 1024, "seq_len": 1024}
    out = tmp / str(seed)
    hops.simulate(sc, seed=seed).write(out)
    return (out / "summary.json").read_bytes(), (out / "events.csv").read_bytes()


def test_same_seed_same_bytes(tmp_path):
    a = outputs(tmp_path / "a", 7)
    b = outputs(tmp_path / "b", 7)
    assert a == b


def test_other_seed_other_numbers(tmp_path):
    assert outputs(tmp_path / "a", 7)[1] != outputs(tmp_path / "b", 8)[1]


def test_events_csv_has_the_contract_header(tmp_path):
    _, events = outputs(tmp_path, 1)
    assert events.decode().splitlines()[0] == "kind,stage,device,microbatch,phase,start_ms,end_ms,src,dst"


def test_importing_hops_stays_light():
    import subprocess
    import sys

    code = "import sys, hops; print(sorted(m for m in ('hydra', 'mlflow', 'matplotlib') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
