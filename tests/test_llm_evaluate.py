"""The tournament reranker and the query rewriters through the LLM layer (scripted endpoint)."""

from __future__ import annotations

import pytest

from cpr_ray.config import Config, EvalConfig, LLMConfig
from cpr_ray.evaluate.rewriters import query_rewriter
from cpr_ray.retrieval.llm_judge import tournament_judge
from cpr_ray.retrieval.rerank import TournamentReranker
from cpr_ray.retrieval.tournament import Round, TournamentSpec

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
    elif kind == "hyde":
        assert out[0] == "We study how to cool chips with a new method."
    else:
        assert out[1].startswith("how to sort mail? We study")
