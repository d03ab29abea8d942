"""Daily practice with a fake clock: the FSRS schedule over a week, the store across processes, bad stores.

Every test uses a store under pytest's tmp_path and a fixed clock: the learner's real store is never touched.
"""
import json
from pathlib import Path
import multiprocessing as mp
import sqlite3
from datetime import timedelta

import pytest
from fsrs import Rating, State

from helpers.practice.daily import Clock, Practice, export_json, import_json, rating_for
from helpers.practice.deck import PracticeError
from helpers.practice.runner import Outcome, Verdict
from helpers.practice.store import SCHEMA_VERSION, Store, StoreError, store_path

START = "2026-12-01T09:00"


def _outcome(card_id: str, passed: bool) -> Outcome:
    return Outcome(card_id, [Verdict("", passed, None if passed else "x", "PASS" if passed else "FAIL")])


@pytest.fixture
def practice(tmp_path):
    return Practice(tmp_path / "p.sqlite3", now=START)


def test_rating_rules():
    assert rating_for(False, False, False) == Rating.Again
    assert rating_for(True, True, False) == Rating.Hard
    assert rating_for(True, False, True) == Rating.Hard
    assert rating_for(True, False, False) == Rating.Good
    assert rating_for(True, False, False, easy=True) == Rating.Easy
    assert rating_for(True, True, False, easy=True) == Rating.Hard


def test_day_one_every_card_new(practice):
    due = practice.due()
    assert len(due) == 13 and all(why == "new" for _, why in due)


def test_failed_today_is_due_again_today_and_a_fix_is_hard(practice):
    a = practice.record("mha", _outcome("mha", False), quiet=True)
    assert a.rating == Rating.Again and a.due < practice.clock.end_of_today()
    assert "mha" in [s.id for s, why in practice.due() if why != "new"]
    b = practice.record("mha", _outcome("mha", True), quiet=True)
    assert b.rating == Rating.Hard and "failed try" in b.why
    practice.hint("sinusoidal")
    assert practice.record("sinusoidal", _outcome("sinusoidal", True), quiet=True).rating == Rating.Hard
    assert practice.record("dropout", _outcome("dropout", True), quiet=True).rating == Rating.Good


def test_a_week_intervals_grow_after_good_and_fall_back_after_again(practice):
    intervals = []
    for day in range(7):  # review "dropout" whenever it is due, passing it, over a week
        ids = [s.id for s, _ in practice.due()]
        if "dropout" in ids:
            now = practice.clock.now()
            fail = day == 5 and intervals  # one lapse late in the week
            a = practice.record("dropout", _outcome("dropout", not fail), quiet=True)
            intervals.append((a.due - now, a.rating))
        practice.advance(days=1)
    good = [dt for dt, r in intervals if r == Rating.Good]
    assert len(good) >= 2 and all(b > a for a, b in zip(good, good[1:])), intervals
    assert all(dt >= timedelta(days=1) for dt in good)
    lapses = [dt for dt, r in intervals if r == Rating.Again]
    if lapses:  # an Again sends a reviewed card back to minutes
        assert lapses[0] < timedelta(hours=1)
    state = practice.states()["dropout"]
    assert state.state in (State.Review, State.Relearning)


def test_again_on_a_review_card_falls_back_to_today(practice):
    practice.record("dropout", _outcome("dropout", True), quiet=True)  # Good: days away
    practice.advance(days=3)
    a = practice.record("dropout", _outcome("dropout", False), quiet=True)
    assert a.rating == Rating.Again and a.due < practice.clock.end_of_today()
    assert practice.states()["dropout"].state == State.Relearning


def test_empty_file_becomes_a_store(tmp_path):
    (tmp_path / "e.sqlite3").write_bytes(b"")
    assert Practice(tmp_path / "e.sqlite3", now=START).states()["mha"] is None


def test_store_survives_a_restart_and_keeps_the_full_review_log(tmp_path):
    p1 = Practice(tmp_path / "s.sqlite3", now=START)
    p1.record("mha", _outcome("mha", False), quiet=True)
    p1.record("mha", _outcome("mha", True), quiet=True)
    p2 = Practice(tmp_path / "s.sqlite3", now=START)  # a new process would see the same file
    assert [r["rating"] for r in p2.reviews()] == [Rating.Again, Rating.Hard]
    assert p2.states()["mha"].due == p1.states()["mha"].due
    assert p2.reschedule()["mha"].due == p1.states()["mha"].due  # recomputed from the review log


def _writer(path: str, card_id: str, n: int) -> None:
    p = Practice(path, now=START)
    for i in range(n):
        p.record(card_id, _outcome(card_id, i % 2 == 1), quiet=True)


def test_two_processes_writing_at_once(tmp_path):
    path = str(tmp_path / "c.sqlite3")  # not created yet: both processes create it, then write
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, cid, 15)) for cid in ("mha", "dropout")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    p = Practice(path, now=START)
    reviews = p.reviews()
    assert len(reviews) == 30
    assert {r["card"] for r in reviews} == {"mha", "dropout"}
    for cid in ("mha", "dropout"):  # each card's state is the last of its 15 reviews, none lost
        assert p.reschedule()[cid].due == p.states()[cid].due


def _checksum(path):
    return path.read_bytes()


def test_newer_schema_is_refused_and_left_untouched(tmp_path):
    path = tmp_path / "n.sqlite3"
    Store(path)
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    db.commit()
    db.close()
    before = _checksum(path)
    with pytest.raises(StoreError, match=r"schema version 2, newer than this code's 1.*left untouched"):
        Practice(path, now=START)
    assert _checksum(path) == before


@pytest.mark.parametrize("content", [b"not a database at all\n" * 10, b"SQLite format 3\x00" + b"\xff" * 200])
def test_corrupt_store_is_refused_and_left_untouched(tmp_path, content):
    path = tmp_path / "bad.sqlite3"
    path.write_bytes(content)
    with pytest.raises(StoreError, match=r"bad\.sqlite3.*left untouched"):
        Practice(path, now=START)
    assert path.read_bytes() == content


def test_other_sqlite_database_is_refused(tmp_path):
    path = tmp_path / "other.sqlite3"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE t (x)")
    db.commit()
    db.close()
    before = _checksum(path)
    with pytest.raises(StoreError, match="not a practice store"):
        Store(path)
    assert _checksum(path) == before


def test_store_path_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTN_PRACTICE_STORE", str(tmp_path / "x.sqlite3"))
    assert store_path() == tmp_path / "x.sqlite3"
    monkeypatch.delenv("ATTN_PRACTICE_STORE")
    assert store_path().name == "practice.sqlite3"  # the user data folder (not created here)


def test_clock_from_environment_and_rules(monkeypatch):
    monkeypatch.setenv("ATTN_PRACTICE_NOW", START)
    c = Clock.from_env()
    assert c.fixed and c.now().isoformat() == "2026-12-01T09:00:00+00:00"
    c.advance(days=1)
    assert c.now().day == 2
    with pytest.raises(PracticeError, match="ISO date-time"):
        Clock("tomorrow")
    with pytest.raises(PracticeError, match="fixed clock only"):
        Clock().advance(days=1)


def test_export_import_round_trip(practice, tmp_path):
    practice.record("mha", _outcome("mha", False), quiet=True)
    practice.hint("mha")
    text = export_json(practice)
    other = Practice(tmp_path / "o.sqlite3", now=START)
    assert import_json(other, text) == 1
    assert json.loads(export_json(other)) == json.loads(text)
    with pytest.raises(PracticeError, match="not a practice export"):
        import_json(other, "{}")
    bad = json.loads(text)
    bad["reviews"][0]["card"] = "nope"
    with pytest.raises(PracticeError, match=r"unknown card\(s\) \['nope'\]"):
        import_json(other, json.dumps(bad))


def test_progress_figure_has_english_labels(practice):
    import matplotlib

    matplotlib.use("Agg")
    practice.record("mha", _outcome("mha", True), quiet=True)
    fig = practice.plot()
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["Cards by state", "Reviews per day", "Passed at the first try"]
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_fit_parameters_needs_a_history(practice):
    practice.record("mha", _outcome("mha", True), quiet=True)
    with pytest.raises(PracticeError, match=r"holds 1 reviews; fitting needs at least 400 \(rule: min_reviews\)"):
        practice.fit_parameters()


def test_committed_notebook_runs_on_a_temporary_store_and_a_fixed_clock():
    """nbval executes notebook 00 as committed: its setup must keep DEMO = True (Practice.demo: tmp store)."""
    nb = json.loads((Path(__file__).resolve().parent.parent / "notebooks" / "00_daily_practice.ipynb").read_text())
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    assert "DEMO = True" in code[0] and "Practice.demo() if DEMO else Practice()" in code[0]
    assert all("Practice(" not in src for src in code[1:]), "only the setup cell builds a Practice"
