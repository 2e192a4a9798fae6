"""The nightly refresh against a full rebuild, on a synthetic corpus with a 1% diff.

Baseline: a full build (ingest through export) on an empty root — what a rebuild from the bulk
shards costs, every pair judged. Candidate: `cpr refresh` of that build after one release step
that touches `--share` of the mined pairs: new cited papers (with their OpenAlex works in a new
snapshot partition), changed ones, deleted papers and citations (`cpr_ray.sample.diffs`), plus
as many changed papers outside any pair. The LLM is the scripted endpoint on loopback with a
fixed latency per answer (`--llm-latency-ms`), the S2 Datasets API its stand-in; both are the
tests' (tests/standins/scripted_llm.py, tests/standins/s2_api.py).

Prints, for each: wall seconds and LLM answers asked (ledger rows), and the refresh's share of
the rebuild. The goal: LLM calls ≤ 2× the diff's share, wall time ≤ 10× it. Usage:

    python benchmarks/refresh.py [--papers 20000] [--citations 200000] [--share 0.01] \
        [--base-per-field 10] [--llm-latency-ms 100] [--in-flight 16]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests.*
from cpr_ray.config import Config, load_config  # noqa: E402
from cpr_ray.llm.spend_ledger import ledger_summary  # noqa: E402
from cpr_ray.pipeline.build import run_build  # noqa: E402
from cpr_ray.pipeline.refresh import refresh  # noqa: E402
from cpr_ray.runs.stage_runner import require_manifest  # noqa: E402
from cpr_ray.sample.diffs import DiffPlan, make_diff  # noqa: E402
from cpr_ray.sample.synthetic import generate  # noqa: E402
from cpr_ray.storage.store import Storage  # noqa: E402
from tests.standins.clients import start_s2_standin, start_scripted_llm  # noqa: E402  (the stand-ins)

OLD, NEW = "2026-11-25", "2026-12-02"


def config(
    root: Path,
    raw: Path,
    llm_url: str,
    s2_url: str,
    in_flight: int,
    base_per_field: int,
    extra: Sequence[str] = (),
) -> Config:
    """The benchmark's build: the dry-run profile on the synthetic corpus, the scripted judge
    and the S2 stand-in; `extra` overrides come last (`benchmarks/scale.py` adds its own)."""
    return load_config(
        "dry-run",
        env={},
        unpin_for_endpoint=True,  # the scripted endpoint answers as a judge would: no pins
        overrides=[
            f"storage.root={root}",
            f"input.s2={raw / 's2'}",
            f"input.openalex={raw / 'openalex'}",
            f"llm.base_url={llm_url}",
            "llm.model=scripted",
            f"llm.max_in_flight={in_flight}",
            "llm.max_rows_per_stage=null",
            "ingest.num_buckets=8",
            "ingest.max_reject_rate=0.05",  # the synthetic shards carry malformed lines
            "mining.min_venue_papers=20",
            f"mining.base_per_field={base_per_field}",
            "pooling.poolers=[{name: bm25, kind: bm25}]",
            "pooling.top_k=10",
            "pooling.top_k_short=10",
            "pooling.min_group_size=1",
            "dataset.eval_per_field=2",
            "dataset.eval_negatives_per_group=1",
            "dataset.train_negatives_per_group=1",
            f"refresh.base_release={OLD}",
            f"refresh.api_url={s2_url}",
            "refresh.requests_per_second=20",
            *extra,
        ],
    )


def clear_diff(raw: Path) -> None:
    """Remove a previous run's OpenAlex diff partition, which a build would otherwise ingest."""
    shutil.rmtree(raw / "openalex" / "works" / "updated_date=2026-12-01", ignore_errors=True)


def release_diff(raw: Path, api_root: Path, pairs: pa.Table, share: float) -> DiffPlan:
    """One S2 release step that touches `share` of the mined `pairs` (new, changed and deleted
    cited papers, deleted citations, and as many changed papers outside any pair) with its
    OpenAlex partition, served by the stand-in rooted at `api_root`."""
    hit = max(1, round(share * pairs.num_rows))
    return make_diff(
        raw / "s2",
        raw / "openalex",
        api_root,
        pairs,
        releases=(OLD, NEW),
        new=max(1, hit // 2),
        changed=max(1, hit // 4),
        deleted=max(1, hit // 8),
        deleted_citations=max(1, hit // 8),
        unpaired_changes=hit,
        openalex_date="2026-12-01",
    )


def answers(storage: Storage) -> int:
    return sum(r["rows"] for r in ledger_summary(storage))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--papers", type=int, default=20_000)
    parser.add_argument("--citations", type=int, default=200_000)
    parser.add_argument("--share", type=float, default=0.01, help="share of pairs the diff hits")
    parser.add_argument("--llm-latency-ms", type=float, default=100.0)
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--base-per-field", type=int, default=10, help="base papers per field")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: tmp)")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="cpr-refresh-bench-"))
    raw, root = work / "raw", work / "build"
    shutil.rmtree(root, ignore_errors=True)
    clear_diff(raw)
    if not (raw / "s2").is_dir():
        generate(raw, args.papers, args.citations, seed=7)
    llm_proc, llm = start_scripted_llm(work / "llm.log")
    s2_proc, s2 = start_s2_standin(work / "s2-api", work / "s2.log")
    os.environ.setdefault("S2_API_KEY", s2.API_KEY)
    try:
        llm.latency(args.llm_latency_ms)
        llm.negatives(1)  # most pooled candidates are not usable, as with a real model
        cfg = config(root, raw, llm.base_url, s2.api_url, args.in_flight, args.base_per_field)
        storage = Storage(cfg.storage)
        started = time.perf_counter()
        run_build(cfg)
        rebuild_s, rebuild_calls = time.perf_counter() - started, answers(storage)
        pairs = pq.read_table(require_manifest(storage, "mine")["tables"]["pairs"]["uri"])
        plan = release_diff(raw, s2.root, pairs, args.share)
        started = time.perf_counter()
        summary = refresh(cfg)
        refresh_s = time.perf_counter() - started
        refresh_calls = answers(storage) - rebuild_calls
    finally:
        llm_proc.terminate()
        s2_proc.terminate()
    touched = len(plan.new_pairs) + len(plan.changed_pairs) + len(plan.retracted_pairs)
    diff_share = touched / pairs.num_rows
    result = {
        "papers": args.papers,
        "citations": args.citations,
        "pairs": pairs.num_rows,
        "pairs_touched": touched,
        "diff_share": round(diff_share, 4),
        "llm_latency_ms": args.llm_latency_ms,
        "rebuild": {"seconds": round(rebuild_s, 1), "llm_answers": rebuild_calls},
        "refresh": {
            "seconds": round(refresh_s, 1),
            "llm_answers": refresh_calls,
            "llm_by_stage": {s: n for s, n in summary["llm_rows"].items() if n},
        },
    }
    call_share = refresh_calls / rebuild_calls if rebuild_calls else float("nan")
    wall_share = refresh_s / rebuild_s
    result["ratios"] = {
        "llm_calls_refresh_over_rebuild": round(call_share, 4),
        "wall_refresh_over_rebuild": round(wall_share, 4),
        "llm_calls_over_diff_share": round(call_share / diff_share, 2),
        "wall_over_diff_share": round(wall_share / diff_share, 2),
    }
    print(json.dumps(result, indent=2))
    print(
        f"refresh vs full rebuild: LLM answers {refresh_calls:,} / {rebuild_calls:,} = "
        f"{call_share:.2%} (goal ≤ {2 * diff_share:.2%}, 2× the diff's {diff_share:.2%}); wall "
        f"{refresh_s:.0f} s / {rebuild_s:.0f} s = {wall_share:.2%} (goal ≤ {10 * diff_share:.1%})"
    )


if __name__ == "__main__":
    main()
