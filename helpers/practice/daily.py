r"""Daily practice (notebook 00, 每日默写): the deck's cards on an FSRS spaced-repetition schedule.

:class:`Practice` ties the deck (:mod:`~helpers.practice.deck`), the store
(:mod:`~helpers.practice.store`), the child-process runner (:mod:`~helpers.practice.runner`) and
the FSRS scheduler (py-fsrs, Ye et al.'s Free Spaced Repetition Scheduler, the one Anki uses), with
one learning step of 10 minutes (:data:`STEPS`).

**Rating from the attempt.** Failed -> Again. Passed after a hint asked since the card's last
attempt, or at the first pass after a failed try today -> Hard. Passed at the first try -> Good
(``easy=True`` says Easy instead). So a card failed today, then fixed (Hard), is rated Good by its
next pass and leaves the learning step: it does not loop all day.

**The clock and the day.** ``ATTN_PRACTICE_NOW`` (an ISO date-time, e.g. ``2026-12-01T09:00``, or
with an offset, ``2026-12-01T09:00+08:00``) fixes "now" for the tests and the notebook's committed
run; :meth:`Practice.advance` then moves it. Unset, the real clock is used. Times are stored in UTC
(as FSRS requires) and shown, and days are counted, in **one time zone, the clock's**: the machine's
local zone for the real clock; for a fixed clock the offset it was given, else UTC. "Today" ends at
the next midnight in that zone (a card due before then is due today), the rating's "today", the
statistics' days and the figure's days all use that same midnight.

The scheduler runs without fuzzing (intervals are not randomised), so the same history always
gives the same schedule.
"""
from __future__ import annotations

import hashlib
import json
import os
import zlib
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Optional

from fsrs import Card, Rating, ReviewLog, Scheduler, State

from .deck import CARDS, DECK, CardSpec, PracticeError
from .deck import card as _card
from .runner import Outcome, run_solution
from .store import Store

#: FSRS's learning and relearning steps: one of 10 minutes. A failed card (Again) or a new card passed
#: with Hard comes back today; a new card passed with Good or Easy goes straight to days-long intervals.
STEPS = (timedelta(minutes=10),)
DEMO_NOW = "2026-12-01T09:00"  # the fixed clock of Practice.demo(): 09:00 UTC on the notes' study day

__all__ = ["DEMO_NOW", "register_magic", "Clock", "Practice", "Attempt", "rating_for", "export_json", "import_json",
           "review_ids"]


class Clock:
    """The time: fixed (``Clock("2026-12-01T09:00")``, moved by :meth:`advance`) or real (``Clock()``).

    ``source`` names where a fixed time came from (``"ATTN_PRACTICE_NOW"``, ``"--now"``), for the error
    message of a malformed one. Days are counted in the clock's zone (module docstring).
    """

    def __init__(self, fixed: Optional[str | datetime] = None, source: str = "now") -> None:
        self.source = source
        if isinstance(fixed, str):
            try:
                fixed = datetime.fromisoformat(fixed)
            except ValueError:
                raise PracticeError(f"the practice clock ({source}) must be an ISO date-time such as "
                                    f"2026-12-01T09:00 or 2026-12-01T09:00+08:00, got {fixed!r}") from None
        if fixed is not None and fixed.tzinfo is None:
            fixed = fixed.replace(tzinfo=timezone.utc)
        self._zone = fixed.tzinfo if fixed is not None else None  # None: the machine's local zone
        self._fixed = fixed.astimezone(timezone.utc) if fixed is not None else None

    @classmethod
    def from_env(cls) -> "Clock":
        return cls(os.environ.get("ATTN_PRACTICE_NOW") or None, source="ATTN_PRACTICE_NOW")

    @property
    def fixed(self) -> bool:
        return self._fixed is not None

    def now(self) -> datetime:
        """Now, in UTC (as FSRS requires)."""
        return self._fixed if self._fixed is not None else datetime.now(timezone.utc)

    def local(self, t: datetime) -> datetime:
        """``t`` in the clock's zone (the one days are counted in)."""
        return t.astimezone(self._zone) if self._zone is not None else t.astimezone()

    def day(self, t: datetime) -> str:
        """The date of ``t`` in the clock's zone, ``YYYY-MM-DD``."""
        return f"{self.local(t):%Y-%m-%d}"

    def end_of_today(self) -> datetime:
        local = self.local(self.now())
        midnight = (local + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
        return midnight.astimezone(timezone.utc)

    def start_of_today(self) -> datetime:
        return self.end_of_today() - timedelta(days=1)

    def advance(self, days: float = 0, hours: float = 0, minutes: float = 0) -> None:
        if not self.fixed:
            raise PracticeError("advance() moves a fixed clock only (rule: set ATTN_PRACTICE_NOW, or "
                                "Practice(now='2026-12-01T09:00')); the real clock moves by itself")
        self._fixed += timedelta(days=days, hours=hours, minutes=minutes)


def rating_for(passed: bool, hinted: bool, failed_today: bool, easy: bool = False) -> Rating:
    """The FSRS rating of an attempt (module docstring): Again, Hard, Good or Easy.

    ``hinted``: a hint of the card was asked since its last attempt (today); ``failed_today``: the
    card's last attempt today failed (so this is the first pass after it).
    """
    if not passed:
        return Rating.Again
    if hinted or failed_today:
        return Rating.Hard
    return Rating.Easy if easy else Rating.Good


@dataclass
class Attempt:
    """One recorded attempt: the card, the checkers' outcome, its rating and when the card is due next."""

    card: str
    outcome: Outcome
    rating: Rating
    due: datetime
    why: str

    @property
    def passed(self) -> bool:
        return self.outcome.passed


def _fsrs_id(card_id: str) -> int:
    return zlib.crc32(card_id.encode())


_WHY = {Rating.Again: "failed", Rating.Good: "passed at the first try",
        Rating.Easy: "passed at the first try, and you said easy"}


def _why(rating: Rating, hinted: bool, today: bool = True, first_today: bool = True) -> str:
    if rating == Rating.Hard:
        return "passed after a hint" if hinted else f"passed after a failed try {'today' if today else 'that day'}"
    if rating in (Rating.Good, Rating.Easy) and not first_today:  # a later pass the same day: not a first try
        return f"passed again {'today' if today else 'that day'}" + (", and you said easy" if rating == Rating.Easy else "")
    return _WHY[rating]


def _when(t: datetime, now: datetime, clock: Optional["Clock"] = None) -> str:
    dt = t - now
    if dt <= timedelta(0):
        return f"now (since {(clock.local(t) if clock else t):%m-%d %H:%M})"
    minutes = dt.total_seconds() / 60
    if minutes < 60:
        return f"in {minutes:.0f} min"
    if minutes < 24 * 60:
        return f"in {minutes / 60:.0f} h"
    return f"in {dt.days} day{'s' if dt.days != 1 else ''} ({clock.day(t) if clock else f'{t:%Y-%m-%d}'})"


class Practice:
    """The learner's daily practice: what is due, dealing a card, checking and recording an attempt.

    Args:
        store: a :class:`~helpers.practice.store.Store` or a path; default ``ATTN_PRACTICE_STORE`` or the
            user data folder.
        now: fix the clock (ISO date-time, UTC unless it has an offset, or a :class:`Clock`); default
            ``ATTN_PRACTICE_NOW``, else the real clock.
        timeout: seconds a check may take (default ``ATTN_PRACTICE_TIMEOUT`` or 60).
        parameters: FSRS's parameters (default py-fsrs's).
    """

    def __init__(self, store: Store | str | os.PathLike | None = None, now: Optional[str | datetime | Clock] = None,
                 timeout: Optional[float] = None, parameters: Optional[tuple[float, ...]] = None) -> None:
        self.clock = now if isinstance(now, Clock) else Clock(now) if now is not None else Clock.from_env()
        self.store = store if isinstance(store, Store) else Store(store)
        self.timeout = timeout
        extra = {"parameters": parameters} if parameters is not None else {}
        self.scheduler = Scheduler(learning_steps=STEPS, relearning_steps=STEPS, enable_fuzzing=False, **extra)

    @classmethod
    def demo(cls, now: str = DEMO_NOW) -> "Practice":
        """A practice on a fresh temporary store with a fixed clock (notebook 00's committed run, the tests)."""
        import atexit
        import shutil
        import tempfile

        folder = tempfile.mkdtemp(prefix="attn-practice-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)  # removed when the kernel exits
        return cls(Path(folder) / "practice.sqlite3", now=now)

    # ------------------------------------------------------------------ state
    def _card_state(self, db, card_id: str) -> Optional[Card]:
        row = db.execute("SELECT fsrs FROM cards WHERE card = ?", (card_id,)).fetchone()
        return Card.from_json(row[0]) if row else None

    def states(self) -> dict[str, Optional[Card]]:
        """``{card id: FSRS Card, or None while the card is new}`` for every card of the deck."""
        rows = dict(self.store.read("SELECT card, fsrs FROM cards"))
        return {c.id: Card.from_json(rows[c.id]) if c.id in rows else None for c in DECK}

    def due(self) -> list[tuple[CardSpec, str]]:
        """The cards due today, each with why, in the order :meth:`deal` takes them.

        First the cards due now (earliest first), then the new ones, then those due later today
        (e.g. a card in its 10-minute learning step), so that a card just failed or fixed does not
        come back before the others. The why names the card's last rating and its reason.
        """
        now, end = self.clock.now(), self.clock.end_of_today()
        last = {}
        for r in self.reviews():  # in order: the last one per card wins
            last[r["card"]] = r
        ready, new, later = [], [], []
        for spec, state in zip(DECK, self.states().values()):
            if state is None:
                new.append((spec, "new"))
            elif state.due < end:
                name = {State.Learning: "learning", State.Review: "review", State.Relearning: "relearning"}[state.state]
                why = f"{name}, due {_when(state.due, now, self.clock)}"
                r = last.get(spec.id)
                if r is not None:
                    why += (f"; last rated {r['rating'].name} on {self.clock.local(r['at']):%Y-%m-%d %H:%M} "
                            f"({r['why']})")
                (ready if state.due <= now else later).append((state.due, spec, why))
        ready.sort(key=lambda t: (t[0], t[1].id))
        later.sort(key=lambda t: (t[0], t[1].id))
        return [(s, why) for _, s, why in ready] + new + [(s, why) for _, s, why in later]

    def today(self) -> None:
        """Print what is due today (:meth:`due` returns it), times in the clock's zone."""
        due = self.due()
        n_new = sum(why == "new" for _, why in due)
        now = self.clock.local(self.clock.now())
        lines = [f"{now:%Y-%m-%d %H:%M} {now.tzname()}: {len(due)} card(s) due today, {n_new} of them new."]
        lines += [f"  {s.id:<22} {why}" for s, why in due]
        print("\n".join(lines))

    # ------------------------------------------------------------------ a card
    @staticmethod
    def show(card_id: str, scaffold: bool = True) -> str:
        """A card's prompt (and scaffold) as text."""
        spec = _card(card_id)
        text = (f"Card {spec.id}: {spec.title} (notebook {spec.notebook}, {spec.section}).\n{spec.prompt}\n"
                f"Define: {', '.join(spec.names)}. Hint: practice.hint({spec.id!r}), or `hint {spec.id}` in a terminal.")
        if scaffold:
            text += "\n\n" + spec.scaffold
        return text

    def deal(self, card_id: Optional[str] = None, new_cell: bool = True) -> None:
        """Show the first due card (or ``card_id``) and put its scaffold into a new cell below.

        The first due card is the first of :meth:`due`: due now, else new, else due later today (then
        dealt early, and said so). In JupyterLab the scaffold arrives in a fresh cell that starts with
        ``%%submit <card>``; elsewhere (or with ``new_cell=False``) it is printed to copy.
        """
        if card_id is None:
            due = self.due()
            if not due:
                print("Nothing is due today.")
                return
            card_id, why = due[0][0].id, due[0][1]
            if why != "new" and self.states()[card_id].due > self.clock.now():
                print(f"Nothing else is due now; {card_id} is dealt early ({why}).")
        spec = _card(card_id)
        shell = _ipython()
        placed = bool(new_cell and shell is not None and getattr(shell, "kernel", None) is not None)
        print(self.show(spec.id, scaffold=False))
        if placed:
            shell.set_next_input(f"%%submit {spec.id}\n{spec.scaffold}", replace=False)
        print(f"\nJupyterLab puts the scaffold into a new cell below, under %%submit {spec.id}; to copy it:\n")
        print(f"%%submit {spec.id}\n{spec.scaffold}")

    def hint(self, card_id: str) -> None:
        """Print the card's hint and record it (the next pass of the card is rated Hard)."""
        spec = _card(card_id)
        with self.store.transaction() as db:
            db.execute("INSERT INTO hints (card, at) VALUES (?, ?)", (spec.id, self.clock.now().isoformat()))
        print(f"Hint for {spec.id}: {spec.hint}")

    def submit(self, card_id: str, source: str, easy: bool = False, quiet: bool = False) -> Attempt:
        """Check ``source`` for the card in a child process, record the attempt, say when it comes back."""
        spec = _card(card_id)
        return self.record(spec.id, run_solution(spec, source, timeout=self.timeout), easy=easy, quiet=quiet)

    def record(self, card_id: str, outcome: Outcome, easy: bool = False, quiet: bool = False) -> Attempt:
        """Rate and record an attempt whose checks have run (``submit`` without the child process)."""
        spec = _card(card_id)
        now = self.clock.now()
        start = self.clock.start_of_today().isoformat()
        with self.store.transaction() as db:
            last = db.execute("SELECT reviewed_at, passed FROM reviews WHERE card = ? AND reviewed_at >= ? "
                              "ORDER BY reviewed_at DESC, id DESC LIMIT 1", (spec.id, start)).fetchone()
            since = max(start, last[0]) if last else start
            hinted = db.execute("SELECT COUNT(*) FROM hints WHERE card = ? AND at >= ? AND at > ?",
                                (spec.id, start, since if last else "")).fetchone()[0] > 0
            failed = last is not None and not last[1]  # this is the first pass after a failed try today
            rating = rating_for(outcome.passed, hinted, failed, easy)
            state = self._card_state(db, spec.id) or Card(card_id=_fsrs_id(spec.id), due=now)
            state, log = self.scheduler.review_card(state, rating, review_datetime=now)
            db.execute("INSERT OR REPLACE INTO cards (card, fsrs) VALUES (?, ?)", (spec.id, state.to_json()))
            db.execute("INSERT INTO reviews (card, reviewed_at, rating, passed, diagnosis, review_log) "
                       "VALUES (?, ?, ?, ?, ?, ?)",
                       (spec.id, now.isoformat(), int(rating), int(outcome.passed), outcome.diagnosis, log.to_json()))
        why = _why(rating, hinted, first_today=last is None)
        attempt = Attempt(spec.id, outcome, rating, state.due, why)
        if not quiet:
            if outcome.output.strip():
                print(outcome.output.rstrip())
            print(outcome.report())
            print(f"Rated {rating.name} ({why}): {spec.id} is due again {_when(state.due, now, self.clock)}.")
        return attempt

    def advance(self, days: float = 0, hours: float = 0, minutes: float = 0) -> None:
        """Move a fixed clock (see :class:`Clock`)."""
        self.clock.advance(days, hours, minutes)

    # ------------------------------------------------------------------ history
    def reviews(self) -> list[dict]:
        """Every review in the order recorded, each with its rating's reason (``why``) as :meth:`record` gave it."""
        rows = self.store.read("SELECT card, reviewed_at, rating, passed, diagnosis, review_log FROM reviews ORDER BY id")
        hints: dict[str, list[str]] = {}
        for c, at in self.store.read("SELECT card, at FROM hints ORDER BY id"):
            hints.setdefault(c, []).append(at)
        out, last_today = [], {}  # card -> (day, reviewed_at) of its previous review
        for c, t, r, p, d, log in rows:
            day = self.clock.day(datetime.fromisoformat(t))
            prev = last_today.get(c)
            since = prev[1] if prev and prev[0] == day else ""
            hinted = any(self.clock.day(datetime.fromisoformat(h)) == day and since < h <= t for h in hints.get(c, []))
            last_today[c] = (day, t)
            out.append(dict(card=c, at=datetime.fromisoformat(t), rating=Rating(r), passed=bool(p), diagnosis=d,
                            review_log=ReviewLog.from_json(log),
                            why=_why(Rating(r), hinted, today=False, first_today=not since)))
        return out

    def first_tries(self) -> list[tuple[str, str, bool]]:
        """``(day, topic, passed at the first try)`` for the first attempt of each card on each day.

        Passed at the first try means rated Good or Easy: a pass after a hint (Hard) does not count.
        """
        seen, out = set(), []
        for r in self.reviews():
            day = self.clock.day(r["at"])
            if (r["card"], day) not in seen:
                seen.add((r["card"], day))
                out.append((day, CARDS[r["card"]].topic, r["rating"] in (Rating.Good, Rating.Easy)))
        return out

    def stats(self) -> dict:
        """Cards by state, reviews per day and first-try pass share per topic (``{topic: (passed, tried)}``).

        Days are dates in the clock's zone; a first try counts as passed only if rated Good or Easy.
        """
        by_state = {"new": 0, "learning": 0, "review": 0, "relearning": 0}
        for state in self.states().values():
            by_state["new" if state is None else state.state.name.lower()] += 1
        per_day: dict[str, int] = {}
        for r in self.reviews():
            day = self.clock.day(r["at"])
            per_day[day] = per_day.get(day, 0) + 1
        first: dict[str, list[int]] = {}
        for _, topic, ok in self.first_tries():
            t = first.setdefault(topic, [0, 0])
            t[0] += ok
            t[1] += 1
        return {"by_state": by_state, "reviews_per_day": per_day, "first_try": {k: tuple(v) for k, v in sorted(first.items())}}

    def print_stats(self) -> None:
        s = self.stats()
        lines = ["cards by state: " + ", ".join(f"{k} {v}" for k, v in s["by_state"].items()),
                 "reviews per day: " + (", ".join(f"{d} {n}" for d, n in s["reviews_per_day"].items()) or "none yet"),
                 "passed at the first try (Good or Easy), by notebook: "
                 + (", ".join(f"{t}: {p}/{n}" for t, (p, n) in s["first_try"].items()) or "none yet")]
        print("\n".join(lines))

    def plot(self):
        """The progress figure (:func:`helpers.practice.progress.plot_progress`)."""
        from .progress import plot_progress

        return plot_progress(self)


def _replay(scheduler: Scheduler, card_id: str, logs: list[ReviewLog]) -> Card:
    """The card's state after its review log, replayed in time order (ties in the order given)."""
    logs = sorted(logs, key=lambda log: log.review_datetime)
    return scheduler.reschedule_card(Card(card_id=_fsrs_id(card_id), due=logs[0].review_datetime), logs)


_REVIEW_COLUMNS = "card, reviewed_at, rating, passed, diagnosis, review_log"


def review_ids(reviews: list[tuple]) -> list[str]:
    """A stable id per review: a hash of its content (card, time, rating, result, diagnosis, FSRS log as
    canonical JSON) and its rank among identical reviews, so the same review has the same id in every
    copy of a store and in every export of it. ``reviews``: tuples in the order of ``_REVIEW_COLUMNS``."""
    seen: dict[str, int] = {}
    out = []
    for card_id, at, rating, passed, diagnosis, log in reviews:
        log = json.loads(log) if isinstance(log, str) else log
        key = json.dumps([card_id, at, int(rating), bool(passed), diagnosis, log], sort_keys=True)
        digest = hashlib.sha1(key.encode()).hexdigest()[:16]
        k = seen[digest] = seen.get(digest, -1) + 1
        out.append(f"{digest}-{k}")
    return out


def export_json(practice: Practice) -> str:
    """The whole store as JSON: card states and every review (with its FSRS ReviewLog and stable id)."""
    cards = {cid: json.loads(f) for cid, f in practice.store.read("SELECT card, fsrs FROM cards ORDER BY card")}
    rows = practice.store.read(f"SELECT {_REVIEW_COLUMNS} FROM reviews ORDER BY id")
    reviews = [dict(id=i, card=c, reviewed_at=t, rating=r, passed=bool(p), diagnosis=d, review_log=json.loads(log))
               for i, (c, t, r, p, d, log) in zip(review_ids(rows), rows)]
    hints = [dict(card=c, at=a) for c, a in practice.store.read("SELECT card, at FROM hints ORDER BY id")]
    return json.dumps({"format": "attention-notebooks practice", "schema_version": 1, "cards": cards,
                       "reviews": reviews, "hints": hints}, indent=1, ensure_ascii=False)


_IMPORT_RULE = "rule: import takes a file written by export, unchanged"


def _utc_iso(value, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be an ISO date-time string, got {value!r}")
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{what} must be an ISO date-time, got {value!r}") from None
    if t.tzinfo is None:
        raise ValueError(f"{what} must carry its UTC offset, got {value!r}")
    return t.astimezone(timezone.utc).isoformat()


def _valid_review(r) -> tuple:
    """One export review as a row of ``_REVIEW_COLUMNS``, or ValueError naming what is wrong."""
    if not isinstance(r, dict):
        raise ValueError(f"must be an object, got {type(r).__name__}")
    missing = [k for k in ("card", "reviewed_at", "rating", "passed", "review_log") if k not in r]
    if missing:
        raise ValueError(f"lacks {', '.join(missing)}")
    if r["card"] not in CARDS:
        raise ValueError(f"unknown card {r['card']!r} (every card must be in the deck)")
    at = _utc_iso(r["reviewed_at"], "reviewed_at")
    if not isinstance(r["rating"], int) or isinstance(r["rating"], bool) or r["rating"] not in (1, 2, 3, 4):
        raise ValueError(f"rating must be 1-4 (Again, Hard, Good, Easy), got {r['rating']!r}")
    if not isinstance(r["passed"], bool):
        raise ValueError(f"passed must be true or false, got {r['passed']!r}")
    if r.get("diagnosis") is not None and not isinstance(r["diagnosis"], str):
        raise ValueError(f"diagnosis must be text or null, got {r['diagnosis']!r}")
    try:
        log = ReviewLog.from_json(json.dumps(r["review_log"]))
    except Exception as e:
        raise ValueError(f"review_log is not an FSRS ReviewLog ({type(e).__name__}: {e})") from None
    if log.card_id != _fsrs_id(r["card"]) or int(log.rating) != r["rating"]:
        raise ValueError("review_log belongs to another card or another rating")
    return (r["card"], at, r["rating"], int(r["passed"]), r.get("diagnosis"), log.to_json())


def _parse_export(text: str) -> tuple[list[tuple], list[tuple]]:
    """Every review and hint of an export, validated; a PracticeError naming the first bad entry otherwise."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise PracticeError(f"import: not JSON ({e}) ({_IMPORT_RULE})") from None
    if not isinstance(data, dict) or data.get("format") != "attention-notebooks practice":
        raise PracticeError(f"import: not a practice export ({_IMPORT_RULE})")
    version = data.get("schema_version")
    if not isinstance(version, int) or version > 1:
        raise PracticeError(f"import: export schema {version!r} is not this code's 1 ({_IMPORT_RULE}; "
                            f"a newer one needs newer code)")
    for key, kind in (("cards", dict), ("reviews", list), ("hints", list)):
        if not isinstance(data.get(key), kind):
            raise PracticeError(f"import: the export has no {kind.__name__} {key!r} "
                                f"({_IMPORT_RULE}: an export holds cards, reviews and hints)")
    for cid, state in data["cards"].items():  # checked, then recomputed from the merged review log
        try:
            if cid not in CARDS:
                raise ValueError("not in the deck")
            Card.from_json(json.dumps(state))
        except Exception as e:
            raise PracticeError(f"import: card state {cid!r} is not an FSRS card of the deck ({type(e).__name__}: {e}) "
                                f"({_IMPORT_RULE}; nothing was imported)") from None
    reviews = []
    for i, r in enumerate(data["reviews"]):
        try:
            reviews.append(_valid_review(r))
        except ValueError as e:
            card_id = r.get("card") if isinstance(r, dict) else None
            raise PracticeError(f"import: review {i}{f' ({card_id})' if card_id else ''}: {e} "
                                f"({_IMPORT_RULE}; nothing was imported)") from None
    hints = []
    for i, h in enumerate(data["hints"]):
        try:
            if not isinstance(h, dict) or h.get("card") not in CARDS:
                raise ValueError(f"must name a card of the deck, got {h!r:.80}")
            hints.append((h["card"], _utc_iso(h.get("at"), "at")))
        except ValueError as e:
            raise PracticeError(f"import: hint {i}: {e} ({_IMPORT_RULE}; nothing was imported)") from None
    return reviews, hints


def import_json(practice: Practice, text: str) -> int:
    """Merge an export into the store; returns the number of reviews added.

    Idempotent: a review already in the store (same stable id, :func:`review_ids`) or a hint already
    there is skipped, so importing the same export twice, or an export of this very store, adds
    nothing. Every entry is validated before anything is written, and the merge is one transaction.
    Each card's state is then rebuilt from its merged review log (in time order), so importing an old
    backup never rewinds a schedule. Raises :class:`PracticeError` (nothing written) for a file that is
    not an export or any entry that is not valid, naming the entry and the rule.
    """
    reviews, hints = _parse_export(text)
    with practice.store.transaction() as db:
        have = set(review_ids(db.execute(f"SELECT {_REVIEW_COLUMNS} FROM reviews ORDER BY id").fetchall()))
        added = [row for row, rid in zip(reviews, review_ids(reviews)) if rid not in have]
        db.executemany(f"INSERT INTO reviews ({_REVIEW_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)", added)
        have_hints: dict[tuple, int] = {}
        for h in db.execute("SELECT card, at FROM hints").fetchall():
            have_hints[h] = have_hints.get(h, 0) + 1
        for h in hints:  # a multiset: as many of each (card, time) as the larger of the two has
            if have_hints.get(h, 0) > 0:
                have_hints[h] -= 1
            else:
                db.execute("INSERT INTO hints (card, at) VALUES (?, ?)", h)
        for cid in sorted({row[0] for row in added}):
            logs = [ReviewLog.from_json(log) for (log,) in
                    db.execute("SELECT review_log FROM reviews WHERE card = ? ORDER BY id", (cid,)).fetchall()]
            db.execute("INSERT OR REPLACE INTO cards (card, fsrs) VALUES (?, ?)",
                       (cid, _replay(practice.scheduler, cid, logs).to_json()))
    return len(added)


def _ipython():
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def register_magic(practice: Practice, walkthrough: bool = True) -> None:
    """``%%submit CARD [easy] [demo]``: the cell's code is CARD's solution, checked by ``practice.submit``.

    A cell with the word ``demo`` belongs to notebook 00's walk-through: it is checked only when
    ``walkthrough`` is true (the notebook's demo mode, on a temporary store) and otherwise skipped
    with a line saying so, so the walk-through's attempts never reach your own store.
    """
    shell = _ipython()
    if shell is None:
        return

    def submit(line: str, cell: str) -> None:
        words = line.split()
        if not words:
            raise PracticeError("%%submit needs the card's id: %%submit mha")
        if "demo" in words[1:] and not walkthrough:
            print(f"(walk-through cell: not checked outside the demo mode, so {words[0]} is not recorded in your store)")
            return
        practice.submit(words[0], cell, easy="easy" in words[1:])

    shell.register_magic_function(submit, magic_kind="cell", magic_name="submit")
