"""The detail page's "Confirm in vLLM" panel under AppTest, on a crafted k grid (tests/test_pages_schedule.py's: k 2
at batch 1, k 1 at batch 4, off at 16) with a stored confirm of its schedule (tests/chart_data.seed_confirm): the
speedup chart holds the server's and the lab's points at each concurrency, the latency table names each server
and the lab run, the schedule's table puts the lab's k beside vLLM's; the form queues a confirm for a worker (shown
waiting), and refuses a second one in one line without storing it. No model and no server."""

from __future__ import annotations

from storage.serving import confirm_jobs
from tests.chart_data import seed_confirm
from tests.test_pages import (
    app,
    assert_clean,
    chart_data,
    empty_db,  # noqa: F401 - the fixture grid needs
    page_text,
)
from tests.test_pages_schedule import grid  # noqa: F401 - the fixture


def _table(at, column: str):
    return next(d.value for d in at.dataframe if column in d.value)


def _frames_with(at, column: str):
    return [frame for datasets in chart_data(at) for frame in datasets if column in frame]


def test_a_stored_confirm_shows_beside_the_lab(grid):  # noqa: F811
    store, eid, ids = grid
    cid = seed_confirm(store, eid, concurrency=(1, 4, 16))
    at = app("experiment", experiment=eid, section="Confirm in vLLM")
    assert_clean(at)
    text = page_text(at)
    assert "Confirm in vLLM" in text and f"Confirm {cid} in vllm 0.32.0" in text
    (speedups,) = [f for f in _frames_with(at, "source") if "speedup" in f and "concurrency" in f]
    server = speedups[speedups["kind"] == "server"].set_index("concurrency")
    lab = speedups[speedups["kind"] == "lab"].set_index("concurrency")
    assert list(server.index) == [1, 4, 16] and server.loc[1, "source"] == "vLLM · schedule (k=2)"
    assert server.loc[4, "source"] == "vLLM · schedule (k=1)"  # vLLM's k at 4 requests: the schedule's entry
    # the lab's run at the batch size equal to the concurrency, with that k: k 2 at batch 1 (1.40×), k 1 at batch 4
    assert lab.loc[1, "speedup"] == 1.40 and (lab.loc[1, "lo"], lab.loc[1, "hi"]) == (1.32, 1.48)
    assert lab.loc[4, "speedup"] == 1.10
    assert 16 not in lab.index  # batch 16 is off in the schedule: vLLM serves k 0 there, the lab ran no k 0
    assert server["lo"].notna().all() and (server["lo"] <= server["speedup"]).all()
    latency = _table(at, "who")
    assert "vLLM · target alone" in set(latency["who"])
    assert f"lab · run {ids[(4, 1)]} (batch 4)" in set(latency["who"])
    side = _table(at, "server_k").set_index("batch_size")
    assert side.loc[1, "lab_k"] == 2 and side.loc[1, "server_k"] == 2
    assert side.loc[4, "lab_k"] == 1 and side.loc[4, "server_k"] == 1
    assert side.loc[1, "lab"].startswith("1.40×")
    positions = [
        f for f in _frames_with(at, "conditional") if set(f["source"]) >= {"vLLM · schedule (k=2), concurrency 1"}
    ]
    assert positions, "the server's acceptance by position is drawn"
    drawn = positions[0].groupby("source")["position"].max()
    assert drawn["vLLM · schedule (k=2), concurrency 1"] == 2
    assert drawn["vLLM · schedule (k=1), concurrency 4"] == 1  # k 2 and 1 mix there: position 1 only


def test_the_form_queues_a_confirm_for_a_worker_and_refuses_a_second(grid):  # noqa: F811
    store, eid, ids = grid
    at = app("experiment", experiment=eid, section="Confirm in vLLM")
    assert_clean(at)
    at.selectbox(key="confirm_configs").set_value("schedule")
    at.multiselect(key="confirm_concurrency").set_value([1, 4])
    at.number_input(key="confirm_repeats").set_value(2)
    next(b for b in at.button if "Queue confirm" in b.label).click().run()
    assert_clean(at)
    (job,) = confirm_jobs.confirm_jobs(store, eid).itertuples()
    assert (job.status, job.configs, job.concurrency, job.repeats) == ("queued", "schedule", "1,4", 2)
    assert "waiting for a worker" in page_text(at)
    second = next(b for b in at.button if "Queue confirm" in b.label)
    assert second.disabled  # one confirm of an experiment at a time: a second is not offered while it is queued
    assert f"confirm {job.confirm_id} is queued" in page_text(at)
    assert len(confirm_jobs.confirm_jobs(store, eid)) == 1
