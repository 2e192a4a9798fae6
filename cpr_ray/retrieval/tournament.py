"""The tournament reranker's bookkeeping, independent of any LLM.

Candidates are narrowed by listwise elimination rounds (each round splits the survivors into
groups and asks a chooser for the most promising of each group), then the last survivors (ten by
default) are scored one by one and sorted by score; every other candidate follows in its input
order. The chooser and scorer are plain callables, so the LLM layer plugs in its own and tests
script them: per call (:func:`run_tournament`, one query) or batched per round
(:func:`run_tournaments`: every group of every query in one round is one batch, so a round can
go through the LLM layer as one table, with its cache, ledger and retries).

Decisions that keep the outcome deterministic whatever a chooser returns:

- groups are contiguous runs of the current survivors (input order), of near-equal size:
  ``ceil(n / group_size)`` groups whose sizes differ by at most one, so 151 in groups of at most
  25 are 22, 22, 22, 22, 21, 21, 21 rather than six of 25 and one of 1;
- a round keeps ``survivors`` candidates in total, shared among groups in proportion to their
  size (largest remainder, earlier group first on a tie); a group whose quota covers it whole is
  kept without asking; a round is skipped when no more than ``survivors`` candidates remain;
- from a chooser's answer, ids not in the group are ignored (``unknown_ids``), repeats are
  ignored (``duplicate_ids``), ids beyond the quota are ignored (``extra_ids``); a short answer
  is filled with the group's remaining candidates in input order (``short_groups``,
  ``filled_ids``); a chooser that raises counts as ``choose_errors`` and is filled whole;
- survivors keep their input order between rounds (not the chooser's order);
- a score that raises, is not a finite number, or falls outside [min_score, max_score] counts as
  ``score_failures``; unscored survivors rank after the scored ones; ties in score (and among the
  unscored) keep input order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

from cpr_ray.errors import UserError

Choose = Callable[[str, list[Any], int], Sequence[Any]]
Score = Callable[[str, Any], float]


@dataclass(frozen=True)
class Round:
    group_size: int  # candidates per group, at most
    survivors: int  # candidates kept after the round, in total

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2, got {self.group_size}")
        if self.survivors < 1:
            raise ValueError(f"survivors must be >= 1, got {self.survivors}")


@dataclass(frozen=True)
class TournamentSpec:
    """Two listwise rounds, 151 -> 30 -> 10, then pointwise 0-10 scores (paper §4)."""

    rounds: tuple[Round, ...] = (Round(25, 30), Round(15, 10))
    min_score: float = 0.0
    max_score: float = 10.0

    def __post_init__(self) -> None:
        if not self.rounds:
            raise ValueError("a tournament needs at least one round")
        counts = [r.survivors for r in self.rounds]
        if any(b >= a for a, b in zip(counts, counts[1:])):
            raise ValueError(f"survivors must decrease from round to round, got {counts}")
        if self.min_score >= self.max_score:
            raise ValueError("min_score must be below max_score")

    @property
    def final_k(self) -> int:
        return self.rounds[-1].survivors

    @classmethod
    def parse(cls, rounds: str) -> TournamentSpec:
        """From `eval.tournament_rounds`, "group_size:survivors" per round ("25:30,15:10")."""
        return cls(
            rounds=tuple(Round(*(int(n) for n in part.split(":"))) for part in rounds.split(","))
        )


@dataclass
class TournamentStats:
    queries: int = 0
    choose_calls: int = 0
    score_calls: int = 0
    rounds_skipped: int = 0
    groups_kept_whole: int = 0
    unknown_ids: int = 0
    duplicate_ids: int = 0
    extra_ids: int = 0
    short_groups: int = 0
    filled_ids: int = 0
    choose_errors: int = 0
    score_failures: int = 0

    def add(self, other: TournamentStats) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def split_groups(items: Sequence[Any], group_size: int) -> list[list[Any]]:
    """Contiguous groups of near-equal size, none larger than `group_size`."""
    n = len(items)
    if n == 0:
        return []
    n_groups = math.ceil(n / group_size)
    base, extra = divmod(n, n_groups)
    out, start = [], 0
    for g in range(n_groups):
        size = base + (1 if g < extra else 0)
        out.append(list(items[start : start + size]))
        start += size
    return out


def quotas(sizes: Sequence[int], survivors: int) -> list[int]:
    """Share `survivors` among groups in proportion to size (largest remainder, stable)."""
    total = sum(sizes)
    if survivors >= total:
        return list(sizes)
    exact = [survivors * s / total for s in sizes]
    out = [min(math.floor(e), s) for e, s in zip(exact, sizes)]
    order = sorted(range(len(sizes)), key=lambda g: (-(exact[g] - out[g]), g))
    left = survivors - sum(out)
    for g in order:
        if left == 0:
            break
        if out[g] < sizes[g]:
            out[g] += 1
            left -= 1
    return out


def _pick(
    answer: Sequence[Any] | None, group: list[Any], quota: int, stats: TournamentStats
) -> list[Any]:
    members = set(group)
    picked: list[Any] = []
    chosen: set[Any] = set()
    for item in answer or ():
        if not isinstance(item, Hashable) or item not in members:
            stats.unknown_ids += 1
        elif item in chosen:
            stats.duplicate_ids += 1
        elif len(picked) == quota:
            stats.extra_ids += 1
        else:
            picked.append(item)
            chosen.add(item)
    if len(picked) < quota:
        stats.short_groups += 1
        fill = [c for c in group if c not in chosen][: quota - len(picked)]
        stats.filled_ids += len(fill)
        picked.extend(fill)
    return picked


def _valid_score(value: Any, spec: TournamentSpec) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    if not math.isfinite(value) or not spec.min_score <= value <= spec.max_score:
        return None
    return value


class ChooseRequest(NamedTuple):
    query_index: int
    query: str
    group: list[Any]
    k: int


class ScoreRequest(NamedTuple):
    query_index: int
    query: str
    doc: Any


# batched forms: one call per round for all queries; an answer may be an Exception (that item
# failed); a batch call that raises fails every item of the batch
ChooseMany = Callable[[list[ChooseRequest]], Sequence[Any]]
ScoreMany = Callable[[list[ScoreRequest]], Sequence[Any]]


def _answers(fn: Callable[[list[Any]], Sequence[Any]], requests: list[Any]) -> list[Any]:
    if not requests:
        return []
    try:
        out = list(fn(requests))
    except UserError:  # a refused key, a dead endpoint, a spend cap: the run stops, in one line
        raise
    except Exception as exc:  # the whole batch failed: every item is a recorded failure
        return [exc] * len(requests)
    if len(out) != len(requests):
        err = ValueError(f"{len(out)} answers for {len(requests)} requests")
        return [err] * len(requests)
    return out


def run_tournaments(
    queries: Sequence[str],
    candidates: Sequence[Sequence[Any]],
    choose_many: ChooseMany,
    score_many: ScoreMany,
    spec: TournamentSpec = TournamentSpec(),
) -> tuple[list[list[Any]], list[TournamentStats]]:
    """Rank every query's candidates, asking for each round of all queries in one batch.

    Returns per query the scored finalists first, then the rest in input order, and its stats.
    """
    if len(queries) != len(candidates):
        raise ValueError(f"{len(candidates)} candidate lists for {len(queries)} queries")
    orders = []
    for cands in candidates:
        order = {c: i for i, c in enumerate(cands)}
        if len(order) != len(cands):
            raise ValueError("candidate ids must be unique")
        orders.append(order)
    stats = [TournamentStats(queries=1) for _ in queries]
    alive = [list(c) for c in candidates]
    for rnd in spec.rounds:
        requests: list[ChooseRequest] = []
        kept: list[list[Any]] = [[] for _ in queries]
        for qi, current in enumerate(alive):
            if len(current) <= rnd.survivors:
                stats[qi].rounds_skipped += 1
                kept[qi] = current
                continue
            groups = split_groups(current, rnd.group_size)
            for group, quota in zip(groups, quotas([len(g) for g in groups], rnd.survivors)):
                if quota >= len(group):
                    stats[qi].groups_kept_whole += 1
                    kept[qi].extend(group)
                elif quota > 0:
                    requests.append(ChooseRequest(qi, queries[qi], list(group), quota))
        for req, answer in zip(requests, _answers(choose_many, requests)):
            st = stats[req.query_index]
            st.choose_calls += 1
            if isinstance(answer, BaseException):
                st.choose_errors += 1
                answer = None
            kept[req.query_index].extend(_pick(answer, req.group, req.k, st))
        alive = [sorted(k, key=orders[qi].__getitem__) for qi, k in enumerate(kept)]
    score_requests = [ScoreRequest(qi, queries[qi], c) for qi, cur in enumerate(alive) for c in cur]
    scores: list[dict[Any, float | None]] = [{} for _ in queries]
    for sreq, value in zip(score_requests, _answers(score_many, score_requests)):
        st = stats[sreq.query_index]
        st.score_calls += 1
        valid = None if isinstance(value, BaseException) else _valid_score(value, spec)
        if valid is None:
            st.score_failures += 1
        scores[sreq.query_index][sreq.doc] = valid
    rankings = []
    for qi, cands in enumerate(candidates):
        s, order = scores[qi], orders[qi]
        top = sorted(alive[qi], key=lambda c: (s[c] is None, -(s[c] or 0.0), order[c]))
        finalists = set(top)
        rankings.append(top + [c for c in cands if c not in finalists])
    return rankings, stats


def one_by_one(fn: Callable[..., Any]) -> Callable[[list[Any]], list[Any]]:
    """A batched callable from a per-item one; a failing item becomes its exception."""

    def many(requests: list[Any]) -> list[Any]:
        out = []
        for req in requests:
            try:
                out.append(fn(*req[1:]))
            except UserError:
                raise
            except Exception as exc:  # recorded by the bookkeeping, never fatal
                out.append(exc)
        return out

    return many


def run_tournament(
    query: str,
    candidates: Sequence[Any],
    choose: Choose,
    score: Score,
    spec: TournamentSpec = TournamentSpec(),
) -> tuple[list[Any], TournamentStats]:
    """Rank `candidates` for `query` with per-call `choose(query, group, k)` and
    `score(query, doc)`; the same bookkeeping as :func:`run_tournaments`."""
    rankings, stats = run_tournaments(
        [query], [candidates], one_by_one(choose), one_by_one(score), spec
    )
    return rankings[0], stats[0]
