"""AnaloBench (Ye et al., 2024) from its public files.

- ``AnaloBench-T2-Base.csv`` (Index, Sentence, Options, Indices): each of the 340 sentences ranks
  200 candidate sentences; ``Options`` are sentence Indexes, ``Indices`` the **1-based positions
  inside Options** of the analogous ones (grade 1).
- ``stories-10.csv`` / ``stories-30.csv`` (cluster, sentence, story): the same analogies told as
  10- and 30-sentence stories; the story variants replace every sentence (query and candidates) by
  its story, matched on the sentence text.
- ``clusters.tsv`` (cluster, sentence): the 340 sentences in 47 clusters of analogous sentences.

Subsets: ``t2``, ``t2-stories-10``, ``t2-stories-30``, and the T1-style choice task ``t1``,
``t1-stories-10``, ``t1-stories-30``.

T1 is built here, deterministically from ``seed``: for every sentence (in Index order) one option
is drawn from the other sentences of its cluster and three from three distinct other clusters
(one sentence each), and the four are shuffled. The task is to pick the analogous one; a retriever
answers by ranking the four, and accuracy is "the right option ranked first" (Recall@1; random
0.25). This reproduces T1's form (one analogous option among four) from the public cluster file;
it is not the original T1 item set.
"""

from __future__ import annotations

import csv
import io

import numpy as np

from cpr_ray.errors import ConfigError, InputError
from cpr_ray.evaluate.benchmark import Benchmark, pad_pools
from cpr_ray.storage.store import Storage, join

SUBSETS = ("t2", "t2-stories-10", "t2-stories-30", "t1", "t1-stories-10", "t1-stories-30")
T1_OPTIONS = 4


def _csv(storage: Storage, uri: str, delimiter: str = ",") -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(storage.read_text(uri)), delimiter=delimiter))


def _ints(text: str, what: str, index: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(
            f"AnaloBench row Index={index}: {what} is not a list of integers"
        ) from None


def load_analobench(storage: Storage, root: str, *, subset: str = "t2", seed: int = 0) -> Benchmark:
    if subset not in SUBSETS:
        raise ConfigError(f"unknown AnaloBench subset {subset!r}; known: {', '.join(SUBSETS)}")
    task, _, stories = subset.partition("-")
    rows = _csv(storage, join(root, "AnaloBench-T2-Base.csv"))
    index = [int(r["Index"]) for r in rows]
    if index != list(range(len(rows))):
        raise InputError("AnaloBench-T2-Base.csv: Index must run 0..n-1 in order")
    sentences = [r["Sentence"] for r in rows]
    clusters_rows = _csv(storage, join(root, "clusters.tsv"), delimiter="\t")
    cluster_of = {r["sentence"]: int(r["cluster"]) for r in clusters_rows}
    missing_cluster = [i for i, s in enumerate(sentences) if s not in cluster_of]
    if missing_cluster:
        raise InputError(f"clusters.tsv lacks {len(missing_cluster)} sentences of T2")
    clusters = np.array([cluster_of[s] for s in sentences])

    texts = list(sentences)
    if stories:
        story_rows = _csv(storage, join(root, f"{stories}.csv"))
        story_of = {r["sentence"]: r["story"] for r in story_rows}
        lacking = [i for i, s in enumerate(sentences) if s not in story_of]
        if lacking:
            raise InputError(f"{stories}.csv has no story for {len(lacking)} sentences of T2")
        texts = [story_of[s] for s in sentences]

    repeated = 0
    if task == "t2":
        pools_list, qrels = [], []
        for r in rows:
            options = _ints(r["Options"], "Options", r["Index"])
            answers = _ints(r["Indices"], "Indices", r["Index"])
            if any(not 1 <= a <= len(options) for a in answers):
                raise InputError(f"AnaloBench row Index={r['Index']}: Indices outside Options")
            qrels.append({options[a - 1]: 1 for a in answers})
            pools_list.append(list(dict.fromkeys(options)))  # an option listed twice, ranked once
            repeated += len(options) - len(pools_list[-1])
        primary = "ndcg_at_10"
    else:
        pools_list, qrels = t1_items(clusters, seed)
        primary = "accuracy"
    return Benchmark(
        name=f"analobench:{subset}",
        query_ids=[str(i) for i in index],
        queries=texts,
        doc_ids=[str(i) for i in index],
        doc_texts=texts,
        qrels=qrels,
        pools=pad_pools(pools_list),
        meta={"cluster": clusters.tolist()},
        primary_metric=primary,
        rejects=[
            {"query_id": "*", "reason": f"{repeated} repeated option(s) dropped (ranked once)"}
        ]
        if repeated
        else [],
    )


def t1_items(clusters: np.ndarray, seed: int) -> tuple[list[list[int]], list[dict[int, int]]]:
    """Four-option items: one analogous sentence (same cluster) and three from other clusters."""
    rng = np.random.default_rng(seed)
    members = {c: np.flatnonzero(clusters == c) for c in np.unique(clusters)}
    pools, qrels = [], []
    for q, c in enumerate(clusters):
        same = members[c][members[c] != q]
        if len(same) == 0:
            raise InputError(f"sentence {q} is alone in cluster {c}: no analogous option")
        answer = int(rng.choice(same))
        others = rng.choice([k for k in members if k != c], size=T1_OPTIONS - 1, replace=False)
        distractors = [int(rng.choice(members[k])) for k in others]
        options = [answer, *distractors]
        pools.append([options[i] for i in rng.permutation(T1_OPTIONS)])
        qrels.append({answer: 1})
    return pools, qrels
