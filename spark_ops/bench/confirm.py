"""A predicted cap measured after all (`experiment --confirm`): how far its prediction was off.

A what-if reads lower caps from one engine's sweep; the cap it is for will run on another engine,
booted later. Whether the two run alike is a property of the machine that no single sweep shows
(the speed check shows only whether one engine held its speed). A confirmation measures it: the
predicted curve of one cap against that cap's own sweep, per level. Where it missed by more than
the tolerance, the machine's engines do not run alike, and no other prediction from the same
sweep is to be trusted either: `distrust_others` marks every point of the other caps.

Pure: a function of the two sweeps' figures (no I/O), checked on data in tests/fixtures/bench/.
"""

from __future__ import annotations

from dataclasses import dataclass

from spark_ops.bench.stats import LevelResult
from spark_ops.bench.whatif import WhatIf, WhatIfCap, untrust

TOLERANCE = 0.2  # a prediction off by more than this at a level missed there


@dataclass(frozen=True)
class LevelError:
    """One level of a confirmed cap: predicted / measured - 1 (None where nothing was measured)."""

    concurrency: int
    aggregate: float | None
    per_user: float | None

    def worst(self) -> float:
        """The larger of the two errors in size, with its sign (0.0 when neither was measured)."""
        errs = [e for e in (self.aggregate, self.per_user) if e is not None]
        return max(errs, key=abs) if errs else 0.0


@dataclass(frozen=True)
class Confirmation:
    """A predicted cap's curve against its own sweep: the error per level and where it missed."""

    cap: int
    tolerance: float
    levels: list[LevelError]

    @property
    def missed(self) -> list[LevelError]:
        """The levels where the prediction was off by more than the tolerance."""
        return [lv for lv in self.levels if abs(lv.worst()) > self.tolerance]

    def lines(self) -> list[str]:
        """What an operator reads: held everywhere, or where it missed and what that means."""
        head = f"Confirmation of cap {self.cap} (predicted, then measured)"
        if not self.levels:
            return [f"{head}: no level was measured in both."]
        if not self.missed:
            worst = max((lv.worst() for lv in self.levels), key=abs)
            return [
                f"{head}: within {self.tolerance:.0%} at every level (worst {worst:+.0%}); "
                "the other predictions from the same sweep stand."
            ]
        where = ", ".join(f"C={lv.concurrency} {lv.worst():+.0%}" for lv in self.missed)
        return [
            f"{head}: off by more than {self.tolerance:.0%} at {where}. This machine's engines "
            "do not run alike after a restart, so no other prediction from the same sweep is "
            "to be trusted: measure a cap before relying on it."
        ]

    def to_dict(self) -> dict[str, object]:
        """Serialize for --json."""
        return {
            "cap": self.cap,
            "tolerance": self.tolerance,
            "levels": [
                {"concurrency": lv.concurrency, "aggregate": lv.aggregate, "per_user": lv.per_user}
                for lv in self.levels
            ],
            "missed": [lv.concurrency for lv in self.missed],
        }


def _error(predicted: float | None, measured: float | None) -> float | None:
    """predicted / measured - 1, or None when either is missing or nothing was measured."""
    if predicted is None or not measured:
        return None
    return predicted / measured - 1


def confirm(
    curve: WhatIfCap, measured: list[LevelResult], tolerance: float = TOLERANCE
) -> Confirmation:
    """The predicted curve of one cap against the levels its own sweep measured."""
    by_c = {lv.max_concurrency: lv for lv in measured}
    levels = [
        LevelError(
            p.concurrency,
            _error(p.aggregate_tok_s, m.output_throughput),
            _error(p.per_user_tok_s, m.per_user_tok_s),
        )
        for p in curve.points
        if (m := by_c.get(p.concurrency)) is not None and m.completed
    ]
    return Confirmation(curve.cap, tolerance, levels)


def distrust_others(whatif: WhatIf, confirmation: Confirmation) -> None:
    """When the confirmation missed: every point of every other cap is not to be trusted."""
    if not confirmation.missed:
        return
    worst = max((lv.worst() for lv in confirmation.missed), key=abs)
    why = f"the prediction for cap {confirmation.cap} missed by {worst:+.0%} when measured"
    for curve in whatif.caps:
        if curve.cap != confirmation.cap:
            for p in curve.points:
                untrust(p, why)
