"""The `llm:` section: the endpoint, its limits and prices, and each LLM stage's overrides."""

from __future__ import annotations

from typing import Any, ClassVar, Literal, cast

from pydantic import Field, field_validator, model_validator

from cpr_ray import stages as registry
from cpr_ray.errors import ConfigError
from cpr_ray.sections import Count, Positive
from cpr_ray.sections import Section as _Section


class LLMStageConfig(_Section):
    # a cap says when to stop paying, not what a stage computes: raising it reruns nothing
    operational: ClassVar[frozenset[str]] = frozenset({"max_usd"})

    model: str | None = Field(None, description="Model for this stage; unset: llm.model.")
    temperature: float | None = Field(None, ge=0, le=2, description="Unset: llm.temperature.")
    max_tokens: int | None = Field(None, ge=16, description="Unset: llm.max_tokens.")
    pin: dict[str, bool | int | str] = Field(
        default_factory=dict,
        description="Answer fields fixed in the schema sent (llm.response_format json_schema "
        "only), e.g. {verdict: transfer}. For a placeholder model whose judgments mean nothing "
        "(the dry run pins the passing answers so every later stage gets rows); never for a "
        "real judge. Pinned answers are cached apart from unpinned ones.",
    )
    max_usd: Positive | None = Field(
        None,
        description="Spend cap of this build stage in USD: every answer its ledger holds "
        "(earlier runs included; a refresh counts its own) at llm.prices. At the cap the stage "
        "stops asking, publishes nothing and says what was spent; a rerun with a higher cap "
        "asks only for what is missing. Unset: no stage cap (llm.max_usd still applies).",
    )


class Price(_Section):
    input_per_mtok: float = Field(0.0, ge=0, description="USD per million prompt tokens.")
    output_per_mtok: float = Field(0.0, ge=0, description="USD per million completion tokens.")
    cached_input_per_mtok: float | None = Field(
        None,
        ge=0,
        description="USD per million prompt tokens the endpoint served from its prompt cache "
        "(the ledger's cached_prompt_tokens, from usage.prompt_tokens_details.cached_tokens), "
        "and the judge-check projection's price of a shared prompt prefix. Unset: "
        "input_per_mtok (no discount).",
    )

    @property
    def cached_per_mtok(self) -> float:
        """The price of a cached prompt token (the input price where none is set)."""
        cached = self.cached_input_per_mtok
        return self.input_per_mtok if cached is None else cached


class FleetConfig(_Section):
    """A self-hosted judge fleet's price: its nodes cost by the hour whatever they answer, so a
    build stage that asks it is charged the node-hours it holds the fleet for, beside its
    tokens at llm.prices."""

    node_hour_usd: Positive | None = Field(
        None,
        description="USD one node of the fleet costs an hour (e.g. g6e.12xlarge on demand). "
        "Each build stage is charged llm.fleet.nodes × this for every hour it asks, in the spend "
        "ledger and against llm.max_usd and llm.stages.<stage>.max_usd, checked at every block "
        "of answers. Unset: the endpoint is paid by the token only (a hosted provider).",
    )
    nodes: Count = Field(
        1,
        description="Nodes the fleet holds while a stage asks it: the most replicas of its "
        "worker group (infra/judges/judges-rayservice.yaml's maxReplicas), so the charge is at "
        "most what the fleet costs, never less.",
    )

    @property
    def usd_per_s(self) -> float:
        """USD the fleet costs a second while a stage asks it (0 when unpriced)."""
        return (self.node_hour_usd or 0.0) * self.nodes / 3600


# the LLM stages of a build (the registry's), which the spend caps cover, and evaluation's and
# search's asks (not capped): the keys `llm.stages` takes, checked as the config loads
BUILD_LLM_STAGES: tuple[str, ...] = registry.LLM_STAGES
LLM_STAGES: tuple[str, ...] = (*BUILD_LLM_STAGES, "rerank-choose", "rerank-score", "rewrite")
BuildLLMStage = Literal[BUILD_LLM_STAGES]  # type: ignore[valid-type]
LLMStage = Literal[LLM_STAGES]  # type: ignore[valid-type]


def stage_name(name: str) -> str:
    """The one spelling of a stage (`judge-analogy`) from either form a user may type.

    Environment variables cannot hold dashes, so `CPR_LLM__STAGES__JUDGE_ANALOGY__MODEL` arrives
    as `judge_analogy`; everything downstream (cache folders, ledger, `--stages`) sees dashes.
    """
    return name.replace("_", "-")


class LLMConfig(_Section):
    operational = frozenset(
        {
            "base_url",
            "api_key_env",
            "max_in_flight",
            "actors",
            "inline_max_rows",
            "timeout_s",
            "max_retries",
            "backoff_base_s",
            "backoff_cap_s",
            "requests_per_second",
            "tokens_per_minute",
            "min_calls_for_failure_rate",
            "prices",
            "max_usd",
            "fleet",
            "allow_same_verifier",
        }
    )

    base_url: str | None = Field(
        None,
        description="OpenAI-compatible endpoint (vLLM, llama.cpp, a provider), e.g. "
        "http://host:8000/v1. Unset in the dry run: the embedded local server is started.",
    )
    api_key_env: str = Field(
        "OPENAI_API_KEY", description="Name of the environment variable holding the API key."
    )
    model: str = Field("gemma-3-270m", description="Model name sent to the endpoint.")
    temperature: float = Field(0.0, ge=0, le=2, description="Sampling temperature.")
    max_tokens: int = Field(1024, ge=16, description="Completion token limit per request.")
    stages: dict[LLMStage, LLMStageConfig] = Field(
        default_factory=dict,
        description=f"Per-stage overrides, keyed by stage: {', '.join(LLM_STAGES)}. The "
        "transfer verification should use a different model from the analogy judge.",
    )
    response_format: Literal["json_schema", "json_schema_plain", "json_object_schema"] = Field(
        "json_schema",
        description="How structured output is requested. json_schema: OpenAI json_schema with "
        "the constrained schema, whose anyOf branches carry the decision rules (vLLM, llama.cpp "
        "server); json_schema_plain: the same form with each answer model's plain schema, for "
        "endpoints that refuse a root anyOf (OpenAI's strict mode); json_object_schema: "
        "json_object with the plain schema (llama-cpp-python's server). Answers are checked "
        "against the rules after they arrive in every form.",
    )
    max_in_flight: Count = Field(64, description="Requests in flight per actor.")
    actors: Count = Field(2, description="LLM actors (each an asyncio client).")
    inline_max_rows: int = Field(
        256,
        ge=0,
        description="A stage with at most this many rows to ask sends them from the driver "
        "(one asyncio client with the pool's actors × max_in_flight in flight, progress and "
        "stops as with a pool), not through an actor pool. A pool costs seconds to start (a "
        "node's start where the autoscaler must add one), which a nightly refresh's handful of "
        "new rows would pay in every LLM stage; 256 answers cost the driver's client under a "
        "second of CPU. Above it, the pool spreads that work over actors. 0: always a pool.",
    )
    timeout_s: Positive = Field(120.0, description="Per-request timeout.")
    max_retries: int = Field(
        6, ge=0, description="Retries of a request on 429/408/5xx, timeouts, connection errors."
    )
    backoff_base_s: Positive = Field(0.5, description="First back-off; doubles per retry.")
    backoff_cap_s: Positive = Field(30.0, description="Longest single back-off.")
    max_reasks: int = Field(
        2, ge=0, description="Re-asks after an invalid, truncated or inconsistent answer."
    )
    requests_per_second: Positive | None = Field(
        None, description="Global request rate limit shared by all actors."
    )
    tokens_per_minute: int | None = Field(
        None, gt=0, description="Global token rate limit shared by all actors."
    )
    max_failure_rate: float = Field(
        0.2,
        ge=0,
        le=1,
        description="Stop a stage when more of its new calls fail in transport (no answer after "
        "retries) than this; checked at the end of every stage. A stage with any failures "
        "publishes as incomplete, so the next run asks those rows again.",
    )
    max_invalid_rate: float = Field(
        0.2,
        ge=0,
        le=1,
        description="Stop a stage when more of its new calls come back invalid (against the "
        "answer contract after re-asks) than this.",
    )
    min_calls_for_failure_rate: Count = Field(
        20,
        description="Calls after which the rates may stop a stage early, before it ends.",
    )
    max_rows_per_stage: Count | None = Field(
        None, description="Cap rows entering each LLM stage (dry runs scale down here)."
    )
    hold_out_flagged_inputs: bool = Field(
        True,
        description="Keep pairs whose texts hold instruction-like text (input_flags: e.g. "
        "'ignore previous instructions', role tags, 'output observed_analogy') out of the "
        "positives: a model that obeys such text can still answer a consistent acceptance.",
    )
    prices: dict[str, Price] = Field(
        default_factory=dict, description="Price table per model name, for the ledger's cost."
    )
    max_usd: Positive | None = Field(
        None,
        description="Spend cap of the build's LLM stages together, in USD: every answer the "
        "root's ledgers hold (earlier stages and runs included; a refresh counts only its own) "
        "at llm.prices, checked as answers arrive. At the cap the stage stops asking, publishes "
        "nothing and says what was spent; a rerun with a higher cap (--set llm.max_usd=…) "
        "asks only for what is missing. Every capped stage's model needs a price. Unset: no "
        "cap. Per stage: llm.stages.<stage>.max_usd.",
    )
    fleet: FleetConfig = Field(
        default_factory=FleetConfig,
        description="The price of a self-hosted judge fleet's nodes (node_hour_usd, nodes): "
        "node-hours charged to each build stage as it asks, against the spend caps.",
    )
    allow_same_verifier: bool = Field(
        False,
        description="Let judge-transfer ask the analogy judge's own model. The method verifies "
        "with a second, different model (llm.stages.judge-transfer.model); a build with one "
        "model for both stops before it starts unless this is true, and its summary says so.",
    )

    @field_validator("stages", mode="before")
    @classmethod
    def _one_spelling(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        return {stage_name(str(k)): v for k, v in value.items()}

    @model_validator(mode="after")
    def _pins_need_constrained_schemas(self) -> LLMConfig:
        pinned = [name for name, o in self.stages.items() if o.pin]
        if pinned and self.response_format != "json_schema":
            raise ValueError(
                f"stages {', '.join(pinned)} pin answer fields, which only the constrained "
                f"schema can carry; response_format is {self.response_format}"
            )
        return self

    @model_validator(mode="after")
    def _pins_only_for_the_placeholder(self) -> LLMConfig:
        # A pin forces an answer through the schema. With an endpoint configured, a real model
        # would be made to pass every pair (the dry-run profile's pins on `cpr build --profile
        # dry-run --llm-base-url …`): stop as the config loads, before any stage or call.
        pinned = [(name, o.pin) for name, o in self.stages.items() if o.pin]
        if pinned and self.base_url:
            named = ", ".join(
                f"llm.stages.{name}.pin {{{', '.join(f'{k}: {v}' for k, v in pin.items())}}}"
                for name, pin in pinned
            )
            raise ValueError(
                f"{named} would force these answers on the model at llm.base_url "
                f"{self.base_url}; pins are for the dry run's embedded placeholder judge only: "
                "remove them for a real endpoint (cpr dry-run --llm-base-url drops them itself)"
            )
        return self

    @model_validator(mode="after")
    def _caps_need_prices(self) -> LLMConfig:
        # a model without a price costs $0 in the ledger, so a cap over it would never stop
        # anything: refuse the cap rather than let it look like a limit
        capped = [s for s, o in self.stages.items() if o.max_usd is not None]
        not_build = [s for s in capped if s not in BUILD_LLM_STAGES]
        if not_build:
            raise ValueError(
                f"llm.stages.{not_build[0]}.max_usd: spend caps cover the build's LLM stages "
                f"({', '.join(BUILD_LLM_STAGES)}), not {not_build[0]}"
            )
        if self.fleet.node_hour_usd:
            return self  # the fleet's node-hours count against the cap, priced tokens or not
        stages = BUILD_LLM_STAGES if self.max_usd is not None else capped
        unpriced: dict[str, list[str]] = {}
        for stage in stages:
            model = self.for_stage(stage)[0]
            price = self.prices.get(model)
            if price is None or not (price.input_per_mtok or price.output_per_mtok):
                unpriced.setdefault(model, []).append(stage)
        if unpriced:
            model, used_by = next(iter(unpriced.items()))
            cap = "llm.max_usd" if self.max_usd is not None else f"llm.stages.{used_by[0]}.max_usd"
            raise ValueError(
                f"{cap} caps spend, but llm.prices has no price above $0 for model {model!r} "
                f"(used by {', '.join(used_by)}), so its answers would count $0 against the "
                "cap: add its input_per_mtok/output_per_mtok under llm.prices, or unset the cap"
            )
        return self

    def pin_for(self, stage: str) -> dict[str, bool | int | str]:
        """The answer fields a stage pins (see LLMStageConfig.pin)."""
        # a name outside LLMStage finds no override, as the default below says
        return self.stages.get(cast(LLMStage, stage_name(stage)), LLMStageConfig()).pin

    def same_verifier(self) -> bool:
        """Whether judge-transfer would ask the analogy judge's own model."""
        transfer, analogy = registry.JUDGE_TRANSFER, registry.JUDGE_ANALOGY
        return self.for_stage(transfer)[0] == self.for_stage(analogy)[0]

    def check_verifier(self) -> None:
        """The method's transfer verification is a second, different model: one model for both
        judges is a config error unless `allow_same_verifier` says it is meant."""
        if self.same_verifier() and not self.allow_same_verifier:
            raise ConfigError(
                "invalid config: llm.stages.judge-transfer.model: judge-transfer would ask "
                f"{self.for_stage(registry.JUDGE_TRANSFER)[0]}, the analogy judge's own model; the "
                "method verifies with a second, different model: name one there, or set "
                "llm.allow_same_verifier: true to accept one model for both"
            )

    def for_stage(self, stage: str) -> tuple[str, float, int]:
        """(model, temperature, max_tokens) of a stage, overrides applied."""
        o = self.stages.get(cast(LLMStage, stage_name(stage)), LLMStageConfig())
        return (
            o.model or self.model,
            self.temperature if o.temperature is None else o.temperature,
            o.max_tokens or self.max_tokens,
        )
