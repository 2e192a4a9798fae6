"""What an evaluation run reads from the one config tree (`eval`, `encoder`, `llm`, `ray`).

The settings themselves are sections of `cpr_ray.config.Config`; this module checks that a run
has what it needs before any loading or encoding, and turns the sections into the plain options
the retrievers and the tournament take.
"""

from __future__ import annotations

from cpr_ray.config import Config, ConfigError, EvalConfig
from cpr_ray.evaluate.tournament import Round, TournamentSpec
from cpr_ray.retrieval.factory import RetrieverOptions
from cpr_ray.retrieval.spec import EncoderSpec

REQUIRED = ("eval.benchmark", "eval.data", "eval.retriever")


def check(cfg: Config) -> None:
    """Everything an evaluation needs, checked before any work (one line per problem)."""
    cfg.require(*REQUIRED)
    try:
        tournament(cfg.eval)
    except ValueError as exc:
        raise ConfigError(f"invalid config: eval.tournament_rounds: {exc}") from None


def tournament(ev: EvalConfig) -> TournamentSpec:
    rounds = []
    for part in ev.tournament_rounds.split(","):
        size, survivors = part.split(":")  # the config validated the shape
        rounds.append(Round(int(size), int(survivors)))
    return TournamentSpec(rounds=tuple(rounds))


def retriever_options(cfg: Config) -> RetrieverOptions:
    enc, ev = cfg.encoder, cfg.eval
    return RetrieverOptions(
        encoder=EncoderSpec.from_config(enc),
        search_backend=ev.search_backend,
        faiss_index=ev.faiss_index,
        ray_min_docs=ev.ray_min_docs,
        ray_max_actors=enc.actors,
        ray_num_cpus=enc.cpus_per_actor,
        ray_num_gpus=enc.gpus_per_actor,
        ray_resources=dict(enc.resources_per_actor),
    )
