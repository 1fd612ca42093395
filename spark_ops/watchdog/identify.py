"""Which history entry a forced restart wrote: the stamp contract's identification rules.

Pure functions over history entries (no I/O), so every rule is tested from data:

- the new entries are the history after the restart minus the history before it (a multiset of
  raw lines: an earlier entry with the same text is never taken for a new one);
- `reports_stamp: false`: what the restart command printed is never trusted;
  `reports_stamp: true`: the printed stamp must be one of the new entries, else the head-clock
  window decides (and the report says so);
- the head-clock window runs from the head's clock before the command started to the moment of
  identification (an asynchronous watchdog writes its stamp after its command returned);
- count before you trust: when several new entries fall in the window (a restart command that
  restarts twice, a watchdog that retries, an automatic restart racing the planned one), each is
  told planned or automatic by evidence — a stamp the command printed (`reports_stamp: true`),
  its own JSON-lines record, else the watchdog's journal record of that stamp (counted per
  value). Every planned-looking one is identified (all of them pruned); when any is left unknown
  (byte-identical lines included: how many are ours cannot be counted) every candidate is listed
  and none is picked (never by file order, never the last printed one alone);
- a new entry outside the window is never pruned silently: the report names it with the command
  that removes it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from spark_ops.errors import AmbiguousStamp
from spark_ops.remote.quoting import quote_word

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

    def kind(self, by_prefix: str) -> str | None:
        """What its own record says (record_kind): "planned", "automatic", or None."""
        return record_kind(self.record, by_prefix)

    def to_dict(self) -> dict[str, Any]:
        """Serialize for reports."""
        return {"stamp": stamp_json(self.stamp), "raw": self.raw}


@dataclass
class Identification:
    """The outcome: the planned entries (none, one, or each of several a restart command that
    restarted more than once left), how they were found, and what the operator is told."""

    entries: list[HistEntry]
    how: str  # reported | window | record | none
    notes: list[str] = field(default_factory=list)
    outside: list[HistEntry] = field(default_factory=list)  # new entries outside the window

    @property
    def entry(self) -> HistEntry | None:
        """The (last) planned entry, when any is identified."""
        return self.entries[-1] if self.entries else None

    @property
    def stamp(self) -> float | None:
        """The (last) planned stamp, when identified."""
        return self.entry.stamp if self.entry is not None else None

    def to_dict(self) -> dict[str, Any]:
        """Serialize for reports."""
        return {
            "stamp": stamp_json(self.stamp),
            "raw": self.entry.raw if self.entry else None,
            "stamps": [stamp_json(e.stamp) for e in self.entries],
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


def record_kind(record: dict[str, Any] | None, by_prefix: str) -> str | None:
    """The one rule for what a restart's record says, an entry's own JSON line or the journal's
    record of its stamp alike: "planned" for `planned: true`, or `forced: true` with a `by`
    starting with by_prefix; "automatic" for any other record that says who restarted (it has
    `planned`, `forced` or `by`: another actor, not forced, or a mark that is not `true`); None
    for no record, another action than a restart, or a record that names none of the three."""
    if not record or record.get("action", "restart") not in ("restart", "append"):
        return None
    by = record.get("by")
    if record.get("planned") is True or (
        record.get("forced") is True and isinstance(by, str) and by.startswith(by_prefix)
    ):
        return "planned"
    if any(k in record for k in ("planned", "forced", "by")):
        return "automatic"
    return None


def _kinds(
    entries: list[HistEntry],
    printed: Sequence[float],
    journal: Sequence[dict[str, Any]],
    by_prefix: str,
) -> list[tuple[HistEntry, str | None, str]]:
    """Each entry with its kind and the evidence for it: its own record, else a printed stamp (one
    entry per print), else a journal record of its stamp (one entry per record)."""
    prints = Counter(round(float(s), 6) for s in printed)
    pool: dict[float, list[str]] = {}
    for rec in journal:
        stamp = rec.get("stamp")
        if isinstance(stamp, bool) or not isinstance(stamp, int | float):
            continue
        kind = record_kind(rec, by_prefix)
        if kind is not None:
            pool.setdefault(round(float(stamp), 6), []).append(kind)
    for kinds in pool.values():
        kinds.sort(key=lambda k: k != "planned")  # a planned record first for a shared value
    out: list[tuple[HistEntry, str | None, str]] = []
    for e in entries:  # an entry's own record first: a print never makes an automatic one ours
        own = e.kind(by_prefix)
        key = round(e.stamp, 6)
        if own == "planned" and prints[key] > 0:
            prints[key] -= 1
        out.append((e, own, "its record"))
    for i, (e, own, _) in enumerate(out):
        key = round(e.stamp, 6)
        if own is not None:
            continue
        if prints[key] > 0:
            prints[key] -= 1
            out[i] = (e, "planned", "printed by the restart command")
        elif pool.get(key):
            out[i] = (e, pool[key].pop(0), "the watchdog's journal")
        else:
            out[i] = (e, None, "no record")
    return out


def identify(
    before: list[HistEntry],
    after: list[HistEntry],
    *,
    window: tuple[float, float],
    reported: float | None,
    reports_stamp: bool,
    by_prefix: str = "spark-ops",
    printed: Sequence[float] = (),
    journal: Sequence[dict[str, Any]] = (),
) -> Identification:
    """The entries a forced restart wrote, per the stamp contract; AmbiguousStamp when several
    appeared and any of them cannot be told planned or automatic.

    `reported` is the (last) stamp the command printed, `printed` every one it printed (trusted
    only with `reports_stamp`); `journal` the watchdog's journal records of restarts.
    """
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
    shown = list(printed) if printed else ([reported] if reported is not None else [])
    trusted = [s for s in shown if reports_stamp]
    matched = [s for s in trusted if any(abs(e.stamp - s) < 1e-6 for e in new)]
    for s in trusted:
        if s not in matched:
            notes.append(
                f"the watchdog printed stamp {fmt_stamp(s)}, which is not one of the history's "
                "new entries: identified by the head's clock instead"
            )
    if matched:  # a printed stamp is the command's own, even outside the window
        inside += [e for e in outside if any(abs(e.stamp - s) < 1e-6 for s in matched)]
        outside = [e for e in outside if e not in inside]
        inside = [e for e in new if e in inside]
    if not inside:
        return Identification([], "none", notes, outside)
    kinds = _kinds(inside, matched, journal, by_prefix)
    if len(inside) == 1:
        (entry, kind, why) = kinds[0]
        if kind == "automatic":  # its own record says the watchdog restarted on its own: kept
            notes.append(
                f"the one new history entry {entry.raw.strip()!r} is the watchdog's own "
                f"(automatic: {why}), kept; no stamp of this restart to prune"
            )
            return Identification([], "none", notes, outside)
        return Identification(inside, "reported" if matched else "window", notes, outside)
    planned = [e for e, k, _ in kinds if k == "planned"]
    unknown = [e for e, k, _ in kinds if k is None]
    if not unknown:
        automatic = [e for e, k, _ in kinds if k == "automatic"]
        if automatic:
            notes.append(
                "new history entries the watchdog recorded as its own (automatic), kept: "
                + ", ".join(repr(e.raw.strip()) for e in automatic)
            )
        if len(planned) > 1:
            notes.append(
                f"{len(planned)} planned-looking entries appeared in the restart's window (the "
                "restart command restarted more than once): all identified"
            )
        by_print = all(why.startswith("printed") for _, k, why in kinds if k == "planned")
        how = "none" if not planned else "reported" if by_print else "record"
        return Identification(planned, how, notes, outside)
    listed = ", ".join(f"{e.raw.strip()!r} ({k or 'unknown'}: {why})" for e, k, why in kinds)
    raise AmbiguousStamp(
        f"{len(inside)} new history entries appeared in the planned restart's window ({listed}) "
        "and cannot all be told planned or automatic (an automatic restart raced it, or the "
        "restart command restarted more than once); none pruned",
        hint="see `spark-ops budget`; each planned one is removed by its command: "
        + " | ".join(prune_command(e) for e in inside),
    )
