"""The run's PNG charts drawn in a forked child (hops.run.charts_alongside) while the run's
process writes the text outputs: the same bytes as drawn in turn, and every failure on either
side reaches the caller as it would without the child, with nothing left running."""
from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest

import hops
import hops.outputs.plots as plots
from hops.outputs import files as outputs
from hops.run.app import write_outputs
from hops.scenario import load_document

SCENARIO = Path(__file__).resolve().parents[1] / "conf" / "scenario" / "hetero_pp4.yaml"


def no_children_left() -> bool:
    try:
        os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def test_charts_drawn_alongside_are_the_bytes_drawn_in_turn(tmp_path):
    written = {}
    for alongside in (False, True):
        result = hops.simulate(str(SCENARIO))  # write_outputs adds to the summary: a fresh result each
        written[alongside] = write_outputs(result, tmp_path / str(alongside), title="t",
                                           charts_alongside=alongside)
    assert set(written[True]) == set(written[False]) >= {"timeline", "dashboard", "events", "summary"}
    for key, path in written[False].items():
        assert written[True][key].read_bytes() == path.read_bytes(), key
    assert no_children_left()


# The chart process is sent its writers pickled: stand-ins are module-level functions.
def dashboard_on_a_full_disk(summary, timeline, path):
    raise OSError(errno.ENOSPC, "No space left on device", str(path))


def broken_timeline(timeline, path, title=None):
    raise ValueError("a chart that cannot be drawn")


def slow_timeline(timeline, path, title=None):
    time.sleep(60)


def test_a_full_disk_in_the_chart_process_is_the_callers_oserror_naming_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(plots, "plot_dashboard", dashboard_on_a_full_disk)
    with pytest.raises(OSError) as exc:
        write_outputs(hops.simulate(str(SCENARIO)), tmp_path / "run", charts_alongside=True)
    assert exc.value.errno == errno.ENOSPC
    assert Path(exc.value.filename2).name == "dashboard.png"  # the output, not its temporary
    assert not list((tmp_path / "run").glob(".*.tmp.*"))
    assert not (tmp_path / "run" / outputs.SUMMARY).exists()  # an incomplete run never looks complete
    assert no_children_left()


def test_a_bug_in_the_chart_process_reaches_the_caller_with_its_traceback(tmp_path, monkeypatch):
    monkeypatch.setattr(plots, "plot_timeline", broken_timeline)
    with pytest.raises(RuntimeError, match=r"(?s)chart process:.*ValueError: a chart that cannot be drawn"):
        write_outputs(hops.simulate(str(SCENARIO)), tmp_path / "run", charts_alongside=True)
    assert no_children_left()


def test_when_the_text_writers_fail_first_the_chart_process_is_ended(tmp_path, monkeypatch):
    def full_disk(timeline, path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(plots, "plot_timeline", slow_timeline)
    monkeypatch.setattr(outputs, "write_events_csv", full_disk)
    start = time.monotonic()
    with pytest.raises(OSError, match="No space left on device"):
        write_outputs(hops.simulate(str(SCENARIO)), tmp_path / "run", charts_alongside=True)
    assert time.monotonic() - start < 30
    assert no_children_left()


@pytest.mark.parametrize("setting,supported,forks", [(False, True, False), (True, True, True), (True, False, False)])
def test_output_plots_alongside_decides_whether_a_child_draws(tmp_path, monkeypatch, setting, supported, forks):
    """true asks for the child even on one core; where the platform has no fork or memory
    files (macOS, Windows) the charts are drawn in turn instead."""
    import hops.run.charts_alongside as alongside

    monkeypatch.setattr(alongside, "supported", lambda: supported)
    started = []
    real = alongside.ChartProcess
    monkeypatch.setattr(alongside, "ChartProcess", lambda: started.append(1) or real())
    doc = load_document(SCENARIO)[0]
    doc["output"] = {**(doc.get("output") or {}), "plots_alongside": setting}
    paths = write_outputs(hops.simulate(doc), tmp_path / "run")
    assert bool(started) == forks
    assert {"timeline", "dashboard"} <= set(paths)


def test_a_chart_process_started_before_the_simulation_draws_the_bytes_drawn_in_turn(tmp_path):
    import hops.run.charts_alongside as alongside

    charts = alongside.ChartProcess()  # as hops.run's task starts it: before there is anything to draw
    early = write_outputs(hops.simulate(str(SCENARIO)), tmp_path / "early", title="t", charts=charts)
    in_turn = write_outputs(hops.simulate(str(SCENARIO)), tmp_path / "in_turn", title="t", charts_alongside=False)
    for key in ("timeline", "dashboard"):
        assert early[key].read_bytes() == in_turn[key].read_bytes(), key
    assert no_children_left()


@pytest.mark.parametrize("output", [{"plots": False}, {"plots_alongside": False}])
def test_a_chart_process_the_run_does_not_draw_in_is_ended(tmp_path, output):
    import hops.run.charts_alongside as alongside

    doc = load_document(SCENARIO)[0]
    doc["output"] = {**(doc.get("output") or {}), **output}
    paths = write_outputs(hops.simulate(doc), tmp_path / "run", charts=alongside.ChartProcess())
    assert ("timeline" in paths) == output.get("plots", True)
    assert no_children_left()
