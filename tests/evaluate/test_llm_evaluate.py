"""The tournament reranker and the query rewriters through the LLM layer (scripted endpoint)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from cpr_ray.config import Config, EvalConfig, LLMConfig
from cpr_ray.evaluate.eval_run import run_eval
from cpr_ray.evaluate.rewriters import passage_problems, query_rewriter
from cpr_ray.retrieval.llm_judge import tournament_judge
from cpr_ray.retrieval.rerank import TournamentReranker
from cpr_ray.retrieval.tournament import Round, TournamentSpec
from tests.evaluate.test_evaluate_loaders import make_cpr_export

pytestmark = pytest.mark.usefixtures("ray_session")


@pytest.fixture()
def cfg(llm, tmp_path):
    return Config(
        llm=LLMConfig(base_url=llm.base_url, model="scripted", max_in_flight=8, actors=1),
        eval=EvalConfig(llm_root=str(tmp_path / "eval-llm")),
    )


def test_llm_tournament_puts_useful_candidates_first_and_caches(cfg, llm):
    docs = {
        f"d{i}": ("a useful method" if i in (7, 23, 41) else f"unrelated text {i}")
        for i in range(60)
    }
    candidates = [list(docs)] * 2
    spec = TournamentSpec(
        rounds=(Round(group_size=20, survivors=12), Round(group_size=6, survivors=5))
    )
    reranker = TournamentReranker(tournament_judge(cfg, docs), spec)
    ranked = reranker.rerank(["how to find a method?", "how to do x?"], candidates)
    for ranking in ranked:
        assert sorted(ranking) == sorted(docs)  # a permutation of the pool
        assert set(ranking[:3]) == {"d7", "d23", "d41"}  # scored 9, the rest 2
    calls = llm.stats()["total"]
    again = TournamentReranker(tournament_judge(cfg, docs), spec).rerank(
        ["how to find a method?", "how to do x?"], candidates
    )
    assert again == ranked and llm.stats()["total"] == calls  # cached: nothing paid twice


@pytest.mark.parametrize("kind", ["hyde", "query2doc", "rag-fusion"])
def test_rewriters(cfg, kind):
    train = [("how to a?", "passage a"), ("how to b?", "passage b")]
    out = query_rewriter(kind, cfg, train).rewrite(["how to cool chips?", "how to sort mail?"])
    assert len(out) == 2
    if kind == "rag-fusion":
        assert out[0][0] == "how to cool chips?" and len(out[0]) == 5
        assert out[0].count("how to cool chips?") == 1
    elif kind == "hyde":  # eval.hyde_passages (4) distinct passages, fused by the runner
        assert out[0] == [f"We study how to cool chips with method {i}." for i in range(4)]
    else:
        assert out[1].startswith("how to sort mail? We study")


class Recording:
    """A first stage that records every text it is asked to rank (one per fused ranking)."""

    name, model = "recording", None

    def __init__(self) -> None:
        self.searched: list[str] = []

    def index(self, texts):
        pass

    def score(self, queries, pools):
        self.searched.extend(queries)
        return np.random.default_rng(0).random(pools.shape)


def _searched(cfg, tmp_path, **eval_keys) -> tuple[list[str], Counter[str]]:
    made = make_cpr_export(tmp_path / "export", n_queries=3)
    ev = cfg.eval.model_copy(
        update={"benchmark": "cpr", "data": str(tmp_path / "export"), "retriever": "bm25"}
        | eval_keys
    )
    first = Recording()
    run_eval(cfg.model_copy(update={"eval": ev}), retriever=first)
    return [r["query"] for r in made["rows"]], Counter(first.searched)


def test_rag_fusion_fuses_the_original_query_once(cfg, tmp_path):
    queries, searched = _searched(cfg, tmp_path, rewrite="rag-fusion")
    for q in queries:  # the original query once, then the LLM's four (v1 searched it twice)
        assert searched[q] == 1
        assert all(searched[f"{q} variant {i}"] == 1 for i in range(4))
    assert sum(searched.values()) == 5 * len(queries)


def test_rag_fusion_without_the_original_query(cfg, tmp_path):
    queries, searched = _searched(
        cfg, tmp_path, rewrite="rag-fusion", fusion_include_original=False
    )
    assert all(searched[q] == 0 for q in queries) and sum(searched.values()) == 4 * len(queries)


@pytest.mark.parametrize("n", [1, 3])
def test_hyde_searches_each_passage_and_never_the_query(cfg, tmp_path, n):
    queries, searched = _searched(cfg, tmp_path, rewrite="hyde", hyde_passages=n)
    for q in queries:
        assert searched[q] == 0
        assert all(searched[f"We study {q} with method {i}."] == 1 for i in range(n))
    assert sum(searched.values()) == n * len(queries)


def test_hyde_passage_problems():
    assert passage_problems(["a b", "c d"], 2) == []
    assert passage_problems(["a b"], 2) == ["write exactly 2 passages (got 1)"]
    assert passage_problems(["A  b", "a b", " "], 3) == [
        "a passage is empty",
        "two passages are the same; each must be different",
    ]
