r"""Daily practice (notebook 00, 每日默写): the deck's cards on an FSRS spaced-repetition schedule.

:class:`Practice` ties the deck (:mod:`~helpers.practice.deck`), the store
(:mod:`~helpers.practice.store`), the child-process runner (:mod:`~helpers.practice.runner`) and
the FSRS scheduler (py-fsrs, Ye et al.'s Free Spaced Repetition Scheduler, the one Anki uses), with
one learning step of 10 minutes (:data:`STEPS`).

**Rating from the attempt.** Failed -> Again. Passed after a hint or after a failed try of the same
card today -> Hard. Passed at the first try -> Good (``easy=True`` says Easy instead).

**The clock.** ``ATTN_PRACTICE_NOW`` (an ISO date-time, e.g. ``2026-12-01T09:00``, read as UTC)
fixes "now" for the tests and the notebook's committed run; :meth:`Practice.advance` then moves it.
Unset, the real clock is used. "Today" ends at the next midnight of the clock (UTC for a fixed
clock, the machine's local time zone for the real one); a card due before then is due today.

The scheduler runs without fuzzing (intervals are not randomised), so the same history always
gives the same schedule.
"""
from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Optional

from fsrs import Card, Rating, ReviewLog, Scheduler, State

from .deck import CARDS, DECK, CardSpec, PracticeError, card as _card
from .runner import Outcome, run_solution
from .store import Store

#: FSRS's learning and relearning steps: one of 10 minutes. A failed card (Again) or a new card passed
#: with Hard comes back today; a new card passed with Good or Easy goes straight to days-long intervals.
STEPS = (timedelta(minutes=10),)
DEMO_NOW = "2026-12-01T09:00"  # the fixed clock of Practice.demo(): 09:00 UTC on the notes' study day

__all__ = ["DEMO_NOW", "register_magic", "Clock", "Practice", "Attempt", "rating_for", "export_json", "import_json"]


class Clock:
    """The time: fixed (``Clock("2026-12-01T09:00")``, moved by :meth:`advance`) or real (``Clock()``)."""

    def __init__(self, fixed: Optional[str | datetime] = None) -> None:
        if isinstance(fixed, str):
            try:
                fixed = datetime.fromisoformat(fixed)
            except ValueError:
                raise PracticeError(f"the practice clock (ATTN_PRACTICE_NOW) must be an ISO date-time such as "
                                    f"2026-12-01T09:00, got {fixed!r}") from None
        if fixed is not None and fixed.tzinfo is None:
            fixed = fixed.replace(tzinfo=timezone.utc)
        self._fixed = fixed.astimezone(timezone.utc) if fixed is not None else None

    @classmethod
    def from_env(cls) -> "Clock":
        return cls(os.environ.get("ATTN_PRACTICE_NOW") or None)

    @property
    def fixed(self) -> bool:
        return self._fixed is not None

    def now(self) -> datetime:
        """Now, in UTC (as FSRS requires)."""
        return self._fixed if self._fixed is not None else datetime.now(timezone.utc)

    def end_of_today(self) -> datetime:
        local = self.now() if self.fixed else self.now().astimezone()
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
    """The FSRS rating of an attempt (module docstring): Again, Hard, Good or Easy."""
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


def _when(t: datetime, now: datetime) -> str:
    dt = t - now
    if dt <= timedelta(0):
        return f"now (since {t:%m-%d %H:%M})"
    minutes = dt.total_seconds() / 60
    if minutes < 60:
        return f"in {minutes:.0f} min"
    if minutes < 24 * 60:
        return f"in {minutes / 60:.0f} h"
    return f"in {dt.days} day{'s' if dt.days != 1 else ''} ({t:%Y-%m-%d})"


class Practice:
    """The learner's daily practice: what is due, dealing a card, checking and recording an attempt.

    Args:
        store: a :class:`~helpers.practice.store.Store` or a path; default ``ATTN_PRACTICE_STORE`` or the
            user data folder.
        now: fix the clock (ISO date-time, UTC); default ``ATTN_PRACTICE_NOW``, else the real clock.
        timeout: seconds a check may take (default ``ATTN_PRACTICE_TIMEOUT`` or 60).
        parameters: FSRS's parameters (default py-fsrs's; :meth:`fit_parameters` fits them to your history).
    """

    def __init__(self, store: Store | str | os.PathLike | None = None, now: Optional[str | datetime] = None,
                 timeout: Optional[float] = None, parameters: Optional[tuple[float, ...]] = None) -> None:
        self.store = store if isinstance(store, Store) else Store(store)
        self.clock = Clock(now) if now is not None else Clock.from_env()
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
        """The cards due today, in order (reviews and relearning first, then new ones), each with why."""
        now, end = self.clock.now(), self.clock.end_of_today()
        old, new = [], []
        for spec, state in zip(DECK, self.states().values()):
            if state is None:
                new.append((spec, "new"))
            elif state.due < end:
                name = {State.Learning: "learning", State.Review: "review", State.Relearning: "relearning"}[state.state]
                last = f"last seen {state.last_review:%Y-%m-%d}" if state.last_review else ""
                old.append((state.due, spec, f"{name}, due {_when(state.due, now)}; {last}".rstrip("; ")))
        old.sort(key=lambda t: (t[0], t[1].id))
        return [(s, why) for _, s, why in old] + new

    def today(self) -> None:
        """Print what is due today (:meth:`due` returns it)."""
        due = self.due()
        n_new = sum(why == "new" for _, why in due)
        lines = [f"{self.clock.now():%Y-%m-%d %H:%M} UTC: {len(due)} card(s) due today, {n_new} of them new."]
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

        In JupyterLab the scaffold arrives in a fresh cell that starts with ``%%submit <card>``;
        elsewhere (or with ``new_cell=False``) it is printed to copy.
        """
        if card_id is None:
            due = self.due()
            if not due:
                print("Nothing is due today.")
                return
            card_id = due[0][0].id
        spec = _card(card_id)
        shell = _ipython()
        placed = bool(new_cell and shell is not None and getattr(shell, "kernel", None) is not None)
        print(self.show(spec.id, scaffold=False))
        if placed:
            shell.set_next_input(f"%%submit {spec.id}\n{spec.scaffold}", replace=False)
        print(f"\nJupyterLab puts the scaffold into a new cell below, under %%submit {spec.id}; to copy it:\n")
        print(f"%%submit {spec.id}\n{spec.scaffold}")

    def hint(self, card_id: str) -> None:
        """Print the card's hint and record it (a pass today after a hint is rated Hard)."""
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
            hinted = db.execute("SELECT COUNT(*) FROM hints WHERE card = ? AND at >= ?", (spec.id, start)).fetchone()[0] > 0
            failed = db.execute("SELECT COUNT(*) FROM reviews WHERE card = ? AND reviewed_at >= ? AND passed = 0",
                                (spec.id, start)).fetchone()[0] > 0
            rating = rating_for(outcome.passed, hinted, failed, easy)
            state = self._card_state(db, spec.id) or Card(card_id=_fsrs_id(spec.id), due=now)
            state, log = self.scheduler.review_card(state, rating, review_datetime=now)
            db.execute("INSERT OR REPLACE INTO cards (card, fsrs) VALUES (?, ?)", (spec.id, state.to_json()))
            db.execute("INSERT INTO reviews (card, reviewed_at, rating, passed, diagnosis, review_log) "
                       "VALUES (?, ?, ?, ?, ?, ?)",
                       (spec.id, now.isoformat(), int(rating), int(outcome.passed), outcome.diagnosis, log.to_json()))
        why = {Rating.Again: "failed", Rating.Hard: "passed after a hint" if hinted else "passed after a failed try today",
               Rating.Good: "passed at the first try", Rating.Easy: "passed at the first try, and you said easy"}[rating]
        attempt = Attempt(spec.id, outcome, rating, state.due, why)
        if not quiet:
            if outcome.output.strip():
                print(outcome.output.rstrip())
            print(outcome.report())
            print(f"Rated {rating.name} ({why}): {spec.id} is due again {_when(state.due, now)}.")
        return attempt

    def advance(self, days: float = 0, hours: float = 0, minutes: float = 0) -> None:
        """Move a fixed clock (see :class:`Clock`)."""
        self.clock.advance(days, hours, minutes)

    # ------------------------------------------------------------------ history
    def reviews(self) -> list[dict]:
        rows = self.store.read("SELECT card, reviewed_at, rating, passed, diagnosis, review_log FROM reviews ORDER BY id")
        return [dict(card=c, at=datetime.fromisoformat(t), rating=Rating(r), passed=bool(p), diagnosis=d,
                     review_log=ReviewLog.from_json(log)) for c, t, r, p, d, log in rows]

    def stats(self) -> dict:
        """Cards by state, reviews per day and first-try pass share per topic (``{topic: (passed, tried)}``)."""
        by_state = {"new": 0, "learning": 0, "review": 0, "relearning": 0}
        for state in self.states().values():
            by_state["new" if state is None else state.state.name.lower()] += 1
        per_day: dict[str, int] = {}
        first: dict[str, list[int]] = {}
        seen_day: set[tuple[str, str]] = set()
        for r in self.reviews():
            day = f"{r['at']:%Y-%m-%d}"
            per_day[day] = per_day.get(day, 0) + 1
            if (r["card"], day) not in seen_day:  # the first try of the card that day
                seen_day.add((r["card"], day))
                t = first.setdefault(CARDS[r["card"]].topic, [0, 0])
                t[0] += r["passed"]
                t[1] += 1
        return {"by_state": by_state, "reviews_per_day": per_day, "first_try": {k: tuple(v) for k, v in sorted(first.items())}}

    def print_stats(self) -> None:
        s = self.stats()
        lines = ["cards by state: " + ", ".join(f"{k} {v}" for k, v in s["by_state"].items()),
                 "reviews per day: " + (", ".join(f"{d} {n}" for d, n in s["reviews_per_day"].items()) or "none yet"),
                 "passed at the first try, by notebook: "
                 + (", ".join(f"{t}: {p}/{n}" for t, (p, n) in s["first_try"].items()) or "none yet")]
        print("\n".join(lines))

    def reschedule(self) -> dict[str, Card]:
        """Recompute every card's state from the full review log (e.g. after changing the scheduler)."""
        logs: dict[str, list[ReviewLog]] = {}
        for r in self.reviews():
            logs.setdefault(r["card"], []).append(r["review_log"])
        out = {}
        for cid, card_logs in logs.items():
            fresh = Card(card_id=_fsrs_id(cid), due=card_logs[0].review_datetime)
            out[cid] = self.scheduler.reschedule_card(fresh, card_logs)
        return out

    def fit_parameters(self, min_reviews: int = 400) -> tuple[float, ...]:
        """FSRS's 21 parameters fitted to this store's review log by py-fsrs's optimizer (optional).

        Pass them back as ``Practice(parameters=...)``. Needs ``min_reviews`` reviews or more, and the
        optimizer's extra packages (``pip install "fsrs[optimizer]"``: torch, pandas, tqdm; not pinned here).
        """
        logs = [r["review_log"] for r in self.reviews()]
        if len(logs) < min_reviews:
            raise PracticeError(f"fit_parameters: the store holds {len(logs)} reviews; fitting needs at least "
                                f"{min_reviews} (rule: min_reviews), else the defaults are the better guess")
        try:
            from fsrs.optimizer import Optimizer
            import pandas  # noqa: F401  (the optimizer imports it lazily)
        except ImportError as e:
            raise PracticeError(f"fit_parameters needs py-fsrs's optimizer extras: pip install \"fsrs[optimizer]\" ({e})") from None
        return tuple(Optimizer(logs).compute_optimal_parameters())

    def plot(self):
        """The progress figure (:func:`helpers.practice.progress.plot_progress`)."""
        from .progress import plot_progress

        return plot_progress(self)


def export_json(practice: Practice) -> str:
    """The whole store as JSON: card states and every review (with its FSRS ReviewLog)."""
    cards = {cid: json.loads(f) for cid, f in practice.store.read("SELECT card, fsrs FROM cards ORDER BY card")}
    reviews = [dict(card=c, reviewed_at=t, rating=r, passed=bool(p), diagnosis=d, review_log=json.loads(log))
               for c, t, r, p, d, log in practice.store.read(
                   "SELECT card, reviewed_at, rating, passed, diagnosis, review_log FROM reviews ORDER BY id")]
    hints = [dict(card=c, at=a) for c, a in practice.store.read("SELECT card, at FROM hints ORDER BY id")]
    return json.dumps({"format": "attention-notebooks practice", "schema_version": 1, "cards": cards,
                       "reviews": reviews, "hints": hints}, indent=1, ensure_ascii=False)


def import_json(practice: Practice, text: str) -> int:
    """Add an export's reviews and hints to the store and take its card states; returns the reviews added.

    Raises :class:`PracticeError` (nothing written) for a file that is not an export, or a card not in the deck.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise PracticeError(f"import: not JSON ({e}) (rule: import takes a file written by export)") from None
    if not isinstance(data, dict) or data.get("format") != "attention-notebooks practice":
        raise PracticeError("import: not a practice export (rule: import takes a file written by export)")
    if data.get("schema_version", 0) > 1:
        raise PracticeError(f"import: export schema {data['schema_version']} is newer than this code's 1")
    unknown = sorted({r["card"] for r in data["reviews"]} - set(CARDS) | set(data["cards"]) - set(CARDS))
    if unknown:
        raise PracticeError(f"import: unknown card(s) {unknown} (rule: every card must be in the deck)")
    with practice.store.transaction() as db:
        for cid, state in data["cards"].items():
            db.execute("INSERT OR REPLACE INTO cards (card, fsrs) VALUES (?, ?)", (cid, json.dumps(state)))
        for r in data["reviews"]:
            db.execute("INSERT INTO reviews (card, reviewed_at, rating, passed, diagnosis, review_log) VALUES (?, ?, ?, ?, ?, ?)",
                       (r["card"], r["reviewed_at"], r["rating"], int(r["passed"]), r["diagnosis"], json.dumps(r["review_log"])))
        for h in data.get("hints", []):
            db.execute("INSERT INTO hints (card, at) VALUES (?, ?)", (h["card"], h["at"]))
    return len(data["reviews"])


def _ipython():
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def register_magic(practice: Practice, demo: Optional[Practice] = None) -> None:
    """``%%submit CARD [easy] [demo]``: the cell's code is CARD's solution, checked by ``practice.submit``.

    With the word ``demo`` the attempt goes to ``demo`` instead (notebook 00's walk-through).
    """
    shell = _ipython()
    if shell is None:
        return

    def submit(line: str, cell: str) -> None:
        words = line.split()
        if not words:
            raise PracticeError("%%submit needs the card's id: %%submit mha")
        target = demo if "demo" in words[1:] and demo is not None else practice
        target.submit(words[0], cell, easy="easy" in words[1:])

    shell.register_magic_function(submit, magic_kind="cell", magic_name="submit")
