"""What the MLflow UI makes of the ledger's experiment tags: the headline view and the link to it.

The rules below are read from MLflow 3.17's UI bundle (mlflow/server/js/build), since the UI, not the
tracking server, interprets these tags:

- A tag `mlflow.sharedViewState.<key>` is a saved view when its value is a JSON envelope with a string
  `name`, a number `createdAt` and a string `state` (the view's JSON); only those are listed under
  "Views". `?viewStateShareKey=<key>` opens it, and older UIs JSON-parse the value as the view itself.
- From a view the UI takes the search facets and UI-state fields below; a column is `<type>.`<name>``.
- `#/experiments/<id>` redirects to a tab keeping only a few query params (`viewStateShareKey` is not
  one), and GenAI vs model training comes from `workflowType` in the URL, else from the browser.

Checked by hand against MLflow 3.17.2 in headless chromium (what was seen: the commit message).
"""
import json
import re
from urllib.parse import parse_qs, urlsplit

from autoresearch import ledger

FACETS = ("searchFilter", "orderByKey", "orderByAsc", "startTime", "lifecycleFilter", "modelVersionFilter",
          "datasetsFilter")
UI_STATE = ("selectedColumns", "columnOrder", "columnWidths", "runsHiddenMode", "compareRunCharts",
            "compareRunSections", "viewMaximized", "runListHidden", "groupBy", "groupsExpanded")
REDIRECT_KEEPS = {"startTimeLabel", "startTime", "endTime", "workflowType", "workspace"}
COLUMN = re.compile(r"^(attributes|params|metrics|tags)\.`[^`]+`$")


def _ui_view(value: str) -> dict:
    """The view MLflow 3.17's UI applies for a shared-view tag value (the envelope path; it raises otherwise)."""
    env = json.loads(value)
    assert isinstance(env, dict) and isinstance(env.get("name"), str) and isinstance(env.get("state"), str)
    assert isinstance(env.get("createdAt"), (int, float)) and not isinstance(env["createdAt"], bool)
    view = json.loads(env["state"])
    return {k: view[k] for k in FACETS + UI_STATE if k in view}


def _link(note: str) -> str:
    links = re.findall(r"\]\((#[^)]+)\)", note)
    assert len(links) == 1, note
    return links[0][1:]


def test_headline_view_is_a_saved_view_the_ui_lists_and_opens():
    tags = ledger.experiment_tags("7")
    assert tags["mlflow.experimentKind"] == "custom_model_development"
    value = tags[f"mlflow.sharedViewState.{ledger.VIEW}"]
    view = _ui_view(value)
    assert json.loads(value)["name"] == ledger.VIEW
    assert all(COLUMN.match(c) for c in view["selectedColumns"]), view["selectedColumns"]
    assert {f"metrics.`{m}`" for m in ledger.HEADLINE_METRICS} <= set(view["selectedColumns"])
    assert {f"tags.`{t}`" for t in ledger.HEADLINE_TAGS} <= set(view["selectedColumns"])
    assert view["orderByKey"] == "attributes.start_time" and view["runsHiddenMode"] == "SHOW_ALL"
    chosen = [c for c in view["selectedColumns"] if not c.startswith("attributes.")]
    assert [c for c in view["columnOrder"] if c in chosen] == chosen, "the grid applies widths only to ordered ids"
    assert view["columnOrder"][:3] == ["attributes.`Run Name`", "runDateAndNestInfo", "duration"]
    assert all(view["columnWidths"][c] >= 7 * len(c.split("`")[1]) for c in chosen), "headers not cut short"
    old_ui = {k: v for k, v in json.loads(value).items() if k in FACETS + UI_STATE}
    assert old_ui == view, "an older UI reads the tag as the view itself"
    assert len(value) <= 20000, "MLflow's limit on an experiment tag value"


def test_description_link_opens_the_runs_table_in_model_training_with_the_view():
    url = urlsplit(_link(ledger.experiment_tags("7")["mlflow.note.content"]))
    query = parse_qs(url.query)
    assert query["viewStateShareKey"] == [ledger.VIEW] and query["workflowType"] == ["machine_learning"]
    tab = re.fullmatch(r"/experiments/7/(\w[\w-]*)", url.path)
    assert (tab and tab.group(1) == "runs") or "viewStateShareKey" in REDIRECT_KEEPS, \
        f"{url.path} redirects to a tab and drops viewStateShareKey"


def test_dressing_keeps_an_unchanged_view_and_upgrades_an_old_one(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    book = ledger.Ledger(uri)
    eid = book.experiment_id(ledger.CALIBRATION)
    first = book.client.get_experiment(eid).tags
    _ui_view(first[ledger.VIEW_TAG])
    assert ledger.experiment_tags(eid, first) == {k: first[k] for k in ledger.experiment_tags(eid, first)}, \
        "an unchanged view keeps its timestamps, so re-dressing writes nothing"

    legacy = json.dumps({"selectedColumns": ["metrics.`spec.mape`"]})  # the tag as this ledger first wrote it
    book.client.set_experiment_tag(eid, ledger.VIEW_TAG, legacy)
    ledger.Ledger(uri).experiment_id(ledger.CALIBRATION)
    upgraded = book.client.get_experiment(eid).tags[ledger.VIEW_TAG]
    assert upgraded != legacy and _ui_view(upgraded)["selectedColumns"] == _ui_view(first[ledger.VIEW_TAG])[
        "selectedColumns"]


def test_the_calibration_scatter_labels_at_least_three_ticks_per_axis(monkeypatch, tmp_path):
    """Both axes are log scale; over a narrow range matplotlib would label one tick (or none)."""
    import pandas as pd
    from matplotlib.figure import Figure

    seen = []
    orig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: (seen.append(self), orig(self, *a, **k))[1])
    for measured, predicted in (([2.2, 2.9, 3.4], [2.4, 3.0, 3.3]),  # within one decade: was one label
                                ([0.6, 3.0, 11.0], [0.7, 2.5, 12.0]),
                                ([0.05, 40.0, 900.0], [0.06, 35.0, 800.0])):
        table = pd.DataFrame({"variant": ["spec"] * 3, "measured_throughput_per_s": measured,
                              "predicted_throughput_per_s": predicted, "throughput_error_pct": [1.0, 2.0, 3.0]})
        ledger._plot_scatter(table, tmp_path / "scatter.png")
        ax = seen[-1].axes[0]
        for axis, (lo, hi) in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
            ticks = [t for t in axis.get_majorticklocs() if lo <= t <= hi]
            labels = [axis.get_major_formatter()(t) for t in ticks]
            assert 3 <= len(ticks) <= 8 and all(labels) and len(set(labels)) == len(labels), (measured, labels)
            assert ticks == sorted(ticks)

