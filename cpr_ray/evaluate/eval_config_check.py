"""What an evaluation run must have in the one config tree, checked before any loading or
encoding (the sections become retriever and tournament options in `cpr_ray.retrieval`)."""

from __future__ import annotations

from cpr_ray.config import Config, ConfigError
from cpr_ray.retrieval.tournament import TournamentSpec

REQUIRED = ("eval.benchmark", "eval.data", "eval.retriever")


def check(cfg: Config) -> None:
    """Everything an evaluation needs, checked before any work (one line per problem)."""
    cfg.require(*REQUIRED)
    try:
        TournamentSpec.parse(cfg.eval.tournament_rounds)
    except ValueError as exc:
        raise ConfigError(f"invalid config: eval.tournament_rounds: {exc}") from None
