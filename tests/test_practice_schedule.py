"""Daily practice with a fake clock: the FSRS schedule over a week, the store across processes, bad stores.

Every test uses a store under pytest's tmp_path and a fixed clock: the learner's real store is never touched.
"""
import json
import multiprocessing as mp
import sqlite3
from datetime import timedelta
from pathlib import Path

import pytest
from fsrs import Rating, State

from helpers.practice.daily import Clock, Practice, _replay, export_json, import_json, rating_for
from helpers.practice.deck import PracticeError
from helpers.practice.runner import Outcome, Verdict
from helpers.practice.store import SCHEMA_VERSION, Store, StoreError, store_path
from pristine import pristine  # tools/pristine.py: the committed copy of a notebook the learner edited

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


def test_a_card_failed_today_is_cleared_today_and_does_not_loop(practice):
    """Fail, fix (Hard: the first pass after the failure), pass again (Good): the card leaves for days."""
    assert practice.record("mha", _outcome("mha", False), quiet=True).rating == Rating.Again
    practice.advance(minutes=20)
    assert practice.record("mha", _outcome("mha", True), quiet=True).rating == Rating.Hard
    practice.advance(minutes=20)
    c = practice.record("mha", _outcome("mha", True), quiet=True)
    assert c.rating == Rating.Good and c.due - practice.clock.now() >= timedelta(days=1)
    assert c.why == "passed again today"  # a Good that is not the day's first attempt is not a first try
    assert [r["why"] for r in practice.reviews() if r["card"] == "mha"][-1] == "passed again that day"
    assert "mha" not in [s.id for s, _ in practice.due()]
    practice.hint("dropout")  # a hint makes the next pass Hard, not every pass after it
    assert practice.record("dropout", _outcome("dropout", True), quiet=True).rating == Rating.Hard
    practice.advance(minutes=20)
    assert practice.record("dropout", _outcome("dropout", True), quiet=True).rating == Rating.Good


def test_deal_takes_cards_due_now_then_new_ones_then_later_ones(practice, capsys):
    practice.record("mha", _outcome("mha", False), quiet=True)  # due again in 10 min
    ids = [s.id for s, _ in practice.due()]
    assert ids[-1] == "mha" and ids[0] == "rotation_matrix", ids  # not yet due: after the 12 new cards
    practice.deal(new_cell=False)
    assert capsys.readouterr().out.startswith("Card rotation_matrix")
    practice.advance(minutes=11)  # now it is due: before the new ones
    assert [s.id for s, _ in practice.due()][0] == "mha"
    for spec in [s for s, why in practice.due() if why == "new"]:
        practice.record(spec.id, _outcome(spec.id, True), quiet=True)
    practice.record("mha", _outcome("mha", True), quiet=True)  # Hard: due in 15 min
    practice.deal(new_cell=False)
    assert "Nothing else is due now; mha is dealt early" in capsys.readouterr().out


def test_a_month_intervals_grow_after_good_and_fall_back_after_again(practice):
    intervals = []
    for day in range(40):  # review "dropout" whenever it is due, passing it, except its third review
        if "dropout" in [s.id for s, _ in practice.due()]:
            now = practice.clock.now()
            a = practice.record("dropout", _outcome("dropout", len(intervals) != 2), quiet=True)
            intervals.append((a.due - now, a.rating))
        practice.advance(days=1)
    ratings = [r for _, r in intervals]
    assert ratings[:3] == [Rating.Good, Rating.Good, Rating.Again], intervals
    good = [dt for dt, r in intervals[:2]]
    assert good[1] > good[0] >= timedelta(days=1), intervals  # grow after Good
    assert intervals[2][0] < timedelta(hours=1), intervals  # an Again sends a reviewed card back to minutes
    assert intervals[2][0] < good[1]
    assert practice.states()["dropout"].state == State.Review and len(intervals) >= 5


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
    logs = [r["review_log"] for r in p2.reviews() if r["card"] == "mha"]
    assert _replay(p2.scheduler, "mha", logs).due == p1.states()["mha"].due  # recomputed from the review log


def _writer(path: str, n: int, barrier) -> None:
    p = Practice(path, now=START)
    barrier.wait()
    for i in range(n):
        p.record("mha", _outcome("mha", i % 3 != 0), quiet=True)
        p.advance(minutes=1)


def test_two_processes_writing_the_same_card_at_once(tmp_path):
    """Each attempt reads the card's state and writes the next one: done outside one transaction, two
    processes would both build on the same old state and the stored state would lose an update."""
    path = str(tmp_path / "c.sqlite3")  # not created yet: both processes create it, then write
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_writer, args=(path, 25, barrier)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    p = Practice(path, now=START)
    reviews = p.reviews()
    assert len(reviews) == 50 and {r["card"] for r in reviews} == {"mha"}
    state = p.states()["mha"]  # the state after all 50 reviews, in the order they were written
    replayed = p.scheduler.reschedule_card(type(state)(card_id=state.card_id, due=reviews[0]["at"]),
                                           [r["review_log"] for r in reviews])
    assert (state.due, state.stability, state.step) == (replayed.due, replayed.stability, replayed.step)


def test_an_attempt_builds_on_the_state_written_while_it_waited(tmp_path):
    """Deterministic form of the race: another writer holds the store's write lock, and while ``record``
    waits for it, that writer commits a newer state of the same card. ``record`` must read the card's
    state inside its own transaction, after the wait, and build on the newer state."""
    import threading
    import time

    from fsrs import Card

    path = tmp_path / "w.sqlite3"
    p = Practice(path, now=START)
    p.record("mha", _outcome("mha", False), quiet=True)
    holder = sqlite3.connect(path, isolation_level=None, timeout=30)
    holder.execute("BEGIN IMMEDIATE")
    waiting = threading.Thread(target=p.record, args=("mha", _outcome("mha", True)), kwargs={"quiet": True})
    waiting.start()
    time.sleep(1.0)  # record is now blocked on the lock
    s1 = Card.from_json(holder.execute("SELECT fsrs FROM cards WHERE card = 'mha'").fetchone()[0])
    s2, log = p.scheduler.review_card(s1, Rating.Good, review_datetime=p.clock.now())  # into Review, days out
    holder.execute("UPDATE cards SET fsrs = ? WHERE card = 'mha'", (s2.to_json(),))
    holder.execute("INSERT INTO reviews (card, reviewed_at, rating, passed, diagnosis, review_log) VALUES "
                   "('mha', ?, 3, 1, NULL, ?)", (p.clock.now().isoformat(), log.to_json()))
    holder.execute("COMMIT")
    holder.close()
    waiting.join(30)
    reviews = p.reviews()
    assert len(reviews) == 3
    replayed = p.scheduler.reschedule_card(Card(card_id=s1.card_id, due=reviews[0]["at"]), [r["review_log"] for r in reviews])
    state = p.states()["mha"]
    assert (state.due, state.stability, state.step) == (replayed.due, replayed.stability, replayed.step)


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
    with pytest.raises(StoreError, match=r"ATTN_PRACTICE_TESTING is set.*rule: under the tests the real store"):
        store_path()  # conftest.py's guard: no test reaches the user data folder
    monkeypatch.delenv("ATTN_PRACTICE_TESTING")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert store_path() == tmp_path / "xdg" / "attention-notebooks" / "practice.sqlite3"  # not created here


def test_no_test_can_reach_the_real_store(tmp_path, monkeypatch):
    """conftest.py points ATTN_PRACTICE_STORE into a temporary folder and sets the guard for every test."""
    import os
    import tempfile

    assert os.environ["ATTN_PRACTICE_TESTING"] == "1" and os.environ["ATTN_PRACTICE_DEMO"] == "1"
    assert Path(os.environ["ATTN_PRACTICE_STORE"]).parent.parent == Path(tempfile.gettempdir())
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    Practice(now=START).record("mha", _outcome("mha", True), quiet=True)  # the default store: conftest's
    assert not (tmp_path / "home").exists() and not (tmp_path / "xdg").exists()
    monkeypatch.delenv("ATTN_PRACTICE_STORE")
    with pytest.raises(StoreError, match="never used"):
        Practice(now=START)
    assert not (tmp_path / "home").exists() and not (tmp_path / "xdg").exists()


def test_store_path_with_question_mark_and_hash(tmp_path):
    folder = tmp_path / "q?x#y"
    p = Practice(folder / "s.sqlite3", now=START)
    p.record("mha", _outcome("mha", True), quiet=True)
    assert Practice(folder / "s.sqlite3", now=START).states()["mha"] is not None
    assert sorted(x.name for x in tmp_path.iterdir()) == ["q?x#y"]  # no stray tmp_path / "q" made by a URI
    db = sqlite3.connect(folder / "s.sqlite3")
    db.execute("UPDATE meta SET value = '9' WHERE key = 'schema_version'")
    db.commit()
    db.close()
    before = _checksum(folder / "s.sqlite3")
    with pytest.raises(StoreError, match="schema version 9"):
        Practice(folder / "s.sqlite3", now=START)
    assert _checksum(folder / "s.sqlite3") == before


def test_days_are_counted_in_the_clocks_zone(tmp_path):
    """One zone for everything: here UTC+8. 23:30 and 00:30 local are two days (UTC: the same day)."""
    p = Practice(tmp_path / "z.sqlite3", now="2026-12-01T23:30+08:00")
    p.record("mha", _outcome("mha", False), quiet=True)
    assert p.clock.start_of_today().isoformat() == "2026-11-30T16:00:00+00:00"
    p.advance(hours=1)  # 00:30 on 12-02 local (16:30 UTC on 12-01): a new day
    assert p.record("mha", _outcome("mha", True), quiet=True).rating == Rating.Good  # yesterday's failure
    assert list(p.stats()["reviews_per_day"]) == ["2026-12-01", "2026-12-02"]
    assert [d for d, _, _ in p.first_tries()] == ["2026-12-01", "2026-12-02"]
    import io
    from contextlib import redirect_stdout

    with redirect_stdout(io.StringIO()) as out:
        p.today()
    assert out.getvalue().startswith("2026-12-02 00:30 UTC+08:00:")
    utc = Clock("2026-12-01T16:30")  # the same instant in UTC is still 12-01 there
    assert utc.day(utc.now()) == "2026-12-01" and p.clock.day(p.clock.now()) == "2026-12-02"


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


def test_import_is_idempotent_and_merges(practice, tmp_path):
    practice.record("mha", _outcome("mha", False), quiet=True)
    practice.hint("mha")
    text = export_json(practice)
    assert import_json(practice, text) == 0 and import_json(practice, text) == 0  # its own export: nothing new
    assert len(practice.reviews()) == 1 and json.loads(export_json(practice)) == json.loads(text)
    other = Practice(tmp_path / "o.sqlite3", now=START)  # another machine: one more review of another card
    import_json(other, text)
    other.advance(minutes=5)
    other.record("dropout", _outcome("dropout", True), quiet=True)
    assert import_json(practice, export_json(other)) == 1
    assert sorted(r["card"] for r in practice.reviews()) == ["dropout", "mha"]
    assert import_json(other, export_json(practice)) == 0
    assert json.loads(export_json(other))["reviews"] == json.loads(export_json(practice))["reviews"]


def test_import_of_an_old_backup_does_not_rewind_the_schedule(practice, tmp_path):
    practice.record("dropout", _outcome("dropout", False), quiet=True)
    backup = export_json(practice)
    practice.advance(minutes=15)
    practice.record("dropout", _outcome("dropout", True), quiet=True)
    practice.advance(minutes=15)
    practice.record("dropout", _outcome("dropout", True), quiet=True)  # Good: days away
    before = practice.states()["dropout"]
    assert import_json(practice, backup) == 0
    assert practice.states()["dropout"].due == before.due
    fresh = Practice(tmp_path / "f.sqlite3", now=START)  # a store with only a later part of the history
    fresh.advance(days=3)
    fresh.record("mha", _outcome("mha", True), quiet=True)
    merged = json.loads(export_json(practice))
    import_json(fresh, json.dumps(merged))
    assert fresh.states()["dropout"].due == before.due  # rebuilt from the merged log


@pytest.mark.parametrize("change, message", [
    (lambda d: d["cards"].update(mha={"due": "soon"}), r"card state 'mha' is not an FSRS card"),
    (lambda d: d.pop("reviews"), r"no list 'reviews'"),
    (lambda d: d["reviews"][0].update(card="nope"), r"review 0 \(nope\): unknown card 'nope'"),
    (lambda d: d["reviews"][0].update(rating=7), r"review 0 \(mha\): rating must be 1-4"),
    (lambda d: d["reviews"][0].update(reviewed_at="yesterday"), r"review 0 \(mha\): reviewed_at must be an ISO"),
    (lambda d: d["reviews"][0].update(review_log={"x": 1}), r"review 0 \(mha\): review_log is not an FSRS ReviewLog"),
    (lambda d: d["reviews"].append(3), r"review 2: must be an object"),
    (lambda d: d["hints"].append({"card": "mha"}), r"hint 1: at must be an ISO date-time"),
])
def test_import_validates_every_entry_before_writing(practice, tmp_path, change, message):
    practice.record("mha", _outcome("mha", False), quiet=True)
    practice.hint("mha")
    data = json.loads(export_json(practice))
    data["reviews"].append(dict(data["reviews"][0], reviewed_at="2026-12-01T09:05:00+00:00"))  # a valid new one
    data["reviews"][-1]["review_log"] = dict(data["reviews"][-1]["review_log"], review_datetime="2026-12-01T09:05:00+00:00")
    data["reviews"][0], data["reviews"][1] = data["reviews"][1], data["reviews"][0]
    change(data)
    other = Practice(tmp_path / "o.sqlite3", now=START)
    with pytest.raises(PracticeError, match=message + r".*\(rule: import takes a file written by export"):
        import_json(other, json.dumps(data))
    assert other.reviews() == [] and other.store.read("SELECT COUNT(*) FROM hints") == [(0,)]
    assert all(s is None for s in other.states().values())
    other.due()  # still a working store
    with pytest.raises(PracticeError, match="not a practice export"):
        import_json(other, "{}")


def test_progress_figure_has_english_labels(practice):
    import matplotlib

    matplotlib.use("Agg")
    practice.record("mha", _outcome("mha", True), quiet=True)
    fig = practice.plot()
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["Cards by state", "Reviews per day", "Passed at the first try"]
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_first_try_counts_only_good_or_easy(practice):
    practice.hint("sinusoidal")
    assert practice.record("sinusoidal", _outcome("sinusoidal", True), quiet=True).rating == Rating.Hard
    practice.record("dropout", _outcome("dropout", True), quiet=True)  # Good
    assert practice.stats()["first_try"] == {"04": (1, 1), "06": (0, 1)}


def test_the_why_names_the_last_rating(practice):
    practice.hint("sinusoidal")
    practice.record("sinusoidal", _outcome("sinusoidal", True), quiet=True)
    practice.record("mha", _outcome("mha", False), quiet=True)
    practice.record("mha", _outcome("mha", True), quiet=True)
    practice.advance(days=1)
    why = dict((s.id, w) for s, w in practice.due())
    assert why["sinusoidal"].endswith("; last rated Hard on 2026-12-01 09:00 (passed after a hint)"), why
    assert why["mha"].endswith("; last rated Hard on 2026-12-01 09:00 (passed after a failed try that day)"), why


def test_committed_notebook_runs_on_a_temporary_store_and_a_fixed_clock():
    """nbval executes notebook 00 as committed: the mode comes from ATTN_PRACTICE_DEMO (conftest.py sets it
    to 1), never from an edited line, and only the setup cell builds a Practice."""
    nb = json.loads(pristine(Path(__file__).resolve().parent.parent / "notebooks" / "00_daily_practice.ipynb").read_text())
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    assert 'DEMO = os.environ.get("ATTN_PRACTICE_DEMO", "1") != "0"' in code[0]
    assert "Practice.demo() if DEMO else Practice()" in code[0] and "register_magic(practice, walkthrough=DEMO)" in code[0]
    assert all("Practice(" not in src and "Practice.demo(" not in src for src in code[1:]), "only the setup cell builds a Practice"
    hints = [src for src in code if ".hint(" in src or ".advance(" in src]
    assert all(src.lstrip().startswith("if DEMO:") for src in hints), hints  # the walk-through never writes to your store
