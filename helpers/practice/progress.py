r"""The progress figure of notebook 00: cards by state, reviews per day, first-try passes per topic.

``plot_progress(practice)`` draws three panels from :meth:`helpers.practice.daily.Practice.reviews`
and ``states``: the deck's cards by FSRS state (new / learning / review / relearning), the number of
reviews on each day, and, per notebook (topic), the cumulative share of first tries of a day that
passed at once (rated Good or Easy: a pass after a hint does not count), day by day, as
:meth:`~helpers.practice.daily.Practice.stats` counts them. Days are dates in the practice clock's
zone. English labels only (a learner's machine may lack a CJK font).
"""
from __future__ import annotations

import matplotlib.pyplot as plt

__all__ = ["plot_progress"]


def plot_progress(practice):
    """A (10 x 3.2 in) figure of the practice history; returns the matplotlib Figure."""
    stats = practice.stats()
    fig, (a0, a1, a2) = plt.subplots(1, 3, figsize=(10, 3.2), layout="constrained")
    names, counts = zip(*stats["by_state"].items())
    a0.bar(names, counts, color=["0.7", "tab:orange", "tab:green", "tab:red"])
    a0.set(title="Cards by state", ylabel="cards", xlabel="FSRS state")
    days = sorted(stats["reviews_per_day"])
    a1.bar(range(len(days)), [stats["reviews_per_day"][d] for d in days], color="tab:blue")
    a1.set_xticks(range(len(days)), [d[5:] for d in days])
    a1.set(title="Reviews per day", ylabel="reviews", xlabel="day (MM-DD)")
    cum = {}  # topic -> [passed, tried, {day: cumulative share}]
    for day, topic, ok in practice.first_tries():  # the first try of each card on each day
        t = cum.setdefault(topic, [0, 0, {}])
        t[0], t[1] = t[0] + ok, t[1] + 1
        t[2][day] = t[0] / t[1]
    for topic, (_, _, series) in sorted(cum.items()):
        xs = [days.index(d) for d in series]
        a2.plot(xs, list(series.values()), marker="o", label=f"notebook {topic}")
    a2.set_xticks(range(len(days)), [d[5:] for d in days])
    a2.set(title="Passed at the first try", ylabel="share rated Good/Easy (cumulative)", xlabel="day (MM-DD)", ylim=(-0.05, 1.05))
    if cum:
        a2.legend(fontsize=7)
    return fig
