"""Which history entry a forced restart wrote: the stamp contract's identification rules.

Pure functions over history entries (no I/O), so every rule is tested from data:

- the new entries are the history after the restart minus the history before it (a multiset of
  raw lines: an earlier entry with the same text is never taken for a new one);
- `reports_stamp: false`: what the restart command printed is never trusted;
  `reports_stamp: true`: the printed stamp must be one of the new entries, else the head-clock
  window decides (and the report says so);
- the head-clock window runs from the head's clock before the command started to the moment of
  identification (an asynchronous watchdog writes its stamp after its command returned);
- among several candidates, entries with byte-identical lines are interchangeable; a JSON-lines
  record marked forced / planned / by spark-ops is told apart from an automatic one; otherwise
  every candidate is listed and none is picked (never by file order);
- a new entry outside the window is never pruned silently: the report names it with the command
  that removes it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from spark_ops.errors import AmbiguousStamp
from spark_ops.remote.program import quote_word

SLACK_S = 1.0  # stamps are whole seconds on most watchdogs: one second of slack either side


@dataclass(frozen=True)
class HistEntry:
    """One well-formed history line: its stamp, its exact text and (JSON lines) its record."""

    stamp: float
    raw: str
    record: dict[str, Any] | None = None

    @classmethod
    def from_read(cls, data: dict[str, Any]) -> HistEntry:
        """Build from an entry of history.py's `read` answer."""
        raw = data.get("raw")
        stamp = float(data["stamp"])
        return cls(stamp, str(raw) if raw is not None else fmt_stamp(stamp), data.get("record"))

    def marked_planned(self, by_prefix: str) -> bool:
        """True when the record itself says it is a forced / planned restart."""
        rec = self.record or {}
        by = rec.get("by")
        return (
            rec.get("planned") is True
            or rec.get("forced") is True
            or (isinstance(by, str) and by.startswith(by_prefix))
        )

    def to_dict(self) -> dict[str, Any]:
        """Serialize for reports."""
        return {"stamp": stamp_json(self.stamp), "raw": self.raw}


@dataclass
class Identification:
    """The outcome: the planned entry (or none), how it was found, and what the operator is told."""

    entry: HistEntry | None
    how: str  # reported | window | identical | record | none
    notes: list[str] = field(default_factory=list)
    outside: list[HistEntry] = field(default_factory=list)  # new entries outside the window

    @property
    def stamp(self) -> float | None:
        """The planned stamp, when identified."""
        return self.entry.stamp if self.entry is not None else None

    def to_dict(self) -> dict[str, Any]:
        """Serialize for reports."""
        return {
            "stamp": stamp_json(self.stamp),
            "raw": self.entry.raw if self.entry else None,
            "how": self.how,
            "notes": self.notes,
            "outside": [e.to_dict() for e in self.outside],
        }


def fmt_stamp(stamp: float) -> str:
    """Print a stamp as the history holds it (integers without a decimal point)."""
    return str(int(stamp)) if float(stamp).is_integer() else repr(float(stamp))


def stamp_json(stamp: float | None) -> int | float | None:
    """A stamp as JSON holds it: the digits fmt_stamp prints (an integer has no `.0`)."""
    if stamp is None:
        return None
    return int(stamp) if float(stamp).is_integer() else float(stamp)


def stamps_json(stamps: Any) -> list[int | float | None]:
    """Several stamps as JSON holds them (stamp_json of each)."""
    return [stamp_json(s) for s in stamps]


def stamps_text(stamps: Any) -> str:
    """Several stamps for a person: fmt_stamp of each, comma-separated ("nothing" if none)."""
    shown = [fmt_stamp(s) for s in stamps]
    return ", ".join(shown) if shown else "nothing"


def prune_command(entry: HistEntry) -> str:
    """The exact command that removes this one entry."""
    if entry.raw.strip() == fmt_stamp(entry.stamp):
        return f"spark-ops budget prune --stamp {fmt_stamp(entry.stamp)}"
    return f"spark-ops budget prune --raw {quote_word(entry.raw)}"


def new_entries(before: list[HistEntry], after: list[HistEntry]) -> list[HistEntry]:
    """Entries of `after` that `before` did not hold (by exact line text, counting repeats)."""
    left = Counter(e.raw for e in before)
    out = []
    for e in reversed(after):  # the last occurrences of a repeated line are the new ones
        if left[e.raw] > 0:
            left[e.raw] -= 1
        else:
            out.append(e)
    return list(reversed(out))


def _pick(entries: list[HistEntry], by_prefix: str) -> tuple[HistEntry | None, str]:
    """One entry of several that stand for the planned restart, or None when they differ."""
    if len(entries) == 1:
        return entries[0], "single"
    if len({e.raw for e in entries}) == 1:
        return entries[-1], "identical"
    marked = [e for e in entries if e.marked_planned(by_prefix)]
    if marked and len({e.raw for e in marked}) == 1:
        return marked[-1], "record"
    return None, "ambiguous"


def identify(
    before: list[HistEntry],
    after: list[HistEntry],
    *,
    window: tuple[float, float],
    reported: float | None,
    reports_stamp: bool,
    by_prefix: str = "spark-ops",
) -> Identification:
    """The entry a forced restart wrote, per the stamp contract; AmbiguousStamp in a race."""
    new = new_entries(before, after)
    lo, hi = window[0] - SLACK_S, window[1] + SLACK_S
    inside = [e for e in new if lo <= e.stamp <= hi]
    outside = [e for e in new if e not in inside]
    notes: list[str] = []
    if outside:
        notes.append(
            "new history entries outside the restart's head-clock window, not pruned: "
            + "; ".join(f"{e.raw!r} (remove with: {prune_command(e)})" for e in outside)
        )
    if reports_stamp and reported is not None:
        matches = [e for e in new if abs(e.stamp - reported) < 1e-6]
        if matches:
            entry, _ = _pick(matches, by_prefix)
            if entry is not None:
                return Identification(entry, "reported", notes, [e for e in outside if e != entry])
            inside = matches
        else:
            notes.append(
                f"the watchdog printed stamp {fmt_stamp(reported)}, which is not one of the "
                "history's new entries: identified by the head's clock instead"
            )
    if not inside:
        return Identification(None, "none", notes, outside)
    entry, how = _pick(inside, by_prefix)
    if entry is not None:
        return Identification(entry, "window" if how == "single" else how, notes, outside)
    listed = ", ".join(repr(e.raw) for e in inside)
    raise AmbiguousStamp(
        f"{len(inside)} new history entries appeared around the planned restart ({listed}) and "
        "cannot be told apart (an automatic restart raced it); none pruned",
        hint="see `spark-ops budget`; the planned one is one of: "
        + " | ".join(prune_command(e) for e in inside),
    )
