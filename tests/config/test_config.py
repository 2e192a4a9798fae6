from pathlib import Path

import pytest

from cpr_ray.config import (
    BUILD_LLM_STAGES,
    ConfigError,
    load_config,
    profile_names,
    sample_dir,
)


def test_profiles_load_and_validate():
    assert {"dry-run", "cluster"} <= set(profile_names())
    dry = load_config("dry-run", env={})
    assert dry.profile == "dry-run"
    assert dry.input.s2 == f"{sample_dir()}/s2"
    assert Path(dry.input.s2, "papers").is_dir()
    cluster = load_config("cluster", env={})
    assert cluster.storage.root.startswith("s3://")


def test_pairs_need_a_citing_sentence_everywhere_but_the_dry_run():
    """The method builds from papers with full text: a pair without a citing sentence is dropped
    by default and by every profile but the dry run's, whose bundled sample has few."""
    assert load_config(env={}).mining.keep_pairs_without_context is False
    kept = {
        name for name in profile_names()
        if load_config(name, env={}).mining.keep_pairs_without_context
    }  # fmt: skip
    assert kept == {"dry-run"}


# App. I / Table 13 of the method: (model, pooling, lr, warm-up, floor, betas, weight decay)
QWEN3 = ("last_token", 6e-6, 0, 0, (0.9, 0.95), 0.1)
RECIPES = {
    "qwen3-embedding-0.6b": ("Qwen/Qwen3-Embedding-0.6B", *QWEN3),
    "qwen3-embedding-4b": ("Qwen/Qwen3-Embedding-4B", *QWEN3),
    "llama-embed-nemotron-8b": (
        "nvidia/llama-embed-nemotron-8b", "mean", 2e-6, 2, 0.01, (0.9, 0.999), 0.01
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_the_methods_training_recipes_are_profiles_on_the_cluster(name: str):
    from cpr_ray.retrieval.encoder import with_instructions
    from cpr_ray.retrieval.spec import EncoderSpec

    model, pooling, lr, warmup, floor, betas, decay = RECIPES[name]
    cfg = load_config(name, env={})
    cluster = load_config("cluster", env={})
    assert cfg.profile == name and cfg.storage == cluster.storage  # the cluster profile, extended
    assert cfg.train.use_gpu and cfg.train.resources_per_worker == {"cpr_gpu_node": 1}
    tc = cfg.train
    assert (cfg.encoder.model, cfg.encoder.pooling) == (model, pooling)
    # llama-embed-nemotron's architecture is its repository's own code (LlamaBidirectionalModel)
    assert cfg.encoder.trust_remote_code == (name == "llama-embed-nemotron-8b")
    assert (tc.lr, tc.warmup_steps, tc.min_lr_ratio, tc.betas, tc.weight_decay) == (
        lr, warmup, floor, betas, decay
    )  # fmt: skip
    # 128 queries a step over the workers, one epoch, clip 1.0, 1,024 tokens in training and
    # evaluation, and the query instruction evaluation uses
    assert (tc.batch_size, tc.epochs, tc.max_grad_norm) == (128, 1, 1.0)
    assert tc.batch_size % tc.workers == 0 and tc.chunk_size  # a gradient cache, not accumulation
    assert tc.max_length == cfg.encoder.max_length == 1024
    spec = with_instructions(EncoderSpec.from_config(cfg.encoder))
    query, doc = spec.query_prefix, spec.doc_prefix
    assert query.startswith("Instruct: ") and query.endswith("\nQuery: ") and doc == ""


def test_precedence_file_then_env_then_flags(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("profile: dry-run\ningest:\n  num_buckets: 3\n  batch_size: 1000\n")
    cfg = load_config(file=cfg_file, env={})
    assert (cfg.ingest.num_buckets, cfg.ingest.batch_size) == (3, 1000)
    cfg = load_config(file=cfg_file, env={"CPR_INGEST__NUM_BUCKETS": "5"})
    assert cfg.ingest.num_buckets == 5
    cfg = load_config(
        file=cfg_file, env={"CPR_INGEST__NUM_BUCKETS": "5"}, overrides=["ingest.num_buckets=7"]
    )
    assert cfg.ingest.num_buckets == 7
    assert cfg.ingest.batch_size == 1000


def test_unknown_key_names_key_and_allowed_keys():
    with pytest.raises(ConfigError) as err:
        load_config("dry-run", overrides=["ingest.num_bucket=4"], env={})
    msg = str(err.value)
    assert "ingest.num_bucket: unknown key" in msg
    assert "num_buckets" in msg and "batch_size" in msg


def test_bad_value_names_key_and_limit():
    with pytest.raises(
        ConfigError, match=r"ingest.num_buckets: Input should be greater than or equal to 1"
    ):
        load_config("dry-run", overrides=["ingest.num_buckets=0"], env={})
    with pytest.raises(
        ConfigError,
        match=r"llm.response_format: Input should be 'json_schema', 'json_schema_plain' or "
        r"'json_object_schema'",
    ):
        load_config("dry-run", overrides=["llm.response_format=xml"], env={})


def test_bad_env_value_fails_before_work():
    with pytest.raises(ConfigError, match="ingest.batch_size"):
        load_config("dry-run", env={"CPR_INGEST__BATCH_SIZE": "many"})


def test_missing_required_and_unknown_profile(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("storage:\n  root: /tmp/x\n")
    with pytest.raises(ConfigError, match="input: required but not set"):
        load_config(file=f, env={}).require("storage.root", "input")
    with pytest.raises(ConfigError, match="unknown profile 'nope'"):
        load_config("nope", env={})
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(file=tmp_path / "missing.yaml", env={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("storage: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(file=bad, env={})


def test_section_hash_tracks_only_named_sections():
    a = load_config("dry-run", env={})
    b = load_config("dry-run", overrides=["llm.model=other"], env={})
    c = load_config("dry-run", overrides=["ingest.num_buckets=9"], env={})
    assert a.section_hash("input", "ingest") == b.section_hash("input", "ingest")
    assert a.section_hash("input", "ingest") != c.section_hash("input", "ingest")


def test_how_a_stage_runs_is_not_part_of_its_fingerprint():
    """The dry run's judge listens on a new port each run, and more actors answer the same:
    neither reruns an LLM stage; a different model or pin does."""
    cfg = load_config("dry-run")
    base = cfg.section_hash("llm")
    same = ["llm.actors=4", "llm.timeout_s=5"]
    assert load_config("dry-run", overrides=same).section_hash("llm") == base
    served = cfg.llm.model_copy(update={"base_url": "http://127.0.0.1:41234/v1"})  # as dry_run
    assert cfg.model_copy(update={"llm": served}).section_hash("llm") == base
    for change in ("llm.model=other", 'llm.stages.dedup.pin={"same_problem": true}'):
        assert load_config("dry-run", overrides=[change]).section_hash("llm") != base, change


def test_a_spend_cap_needs_a_price_for_every_model_it_covers():
    """A model without a price (or at $0) counts $0 in the ledger, so a cap over it could never
    stop anything: the config is refused with one line naming the model and the cap. A stage's
    cap needs only its own model's price; a cap must be above $0 and only build stages have
    one; raising a cap reruns nothing (it is not part of the stage's fingerprint)."""
    priced = ["llm.prices.gemma-3-270m.input_per_mtok=0.1"]
    with pytest.raises(
        ConfigError,
        match=r"llm.max_usd caps spend, but llm.prices has no "
        r"price above \$0 for model 'gemma-3-270m' \(used by judge-analogy, ",
    ):
        load_config("dry-run", overrides=["llm.max_usd=10"], env={})
    zero = ["llm.prices.gemma-3-270m.input_per_mtok=0", "llm.prices.gemma-3-270m.output_per_mtok=0"]
    with pytest.raises(ConfigError, match="no price above"):
        load_config("dry-run", overrides=[*zero, "llm.max_usd=10"], env={})
    other = ["llm.stages.judge-negatives.model=big", "llm.stages.judge-negatives.max_usd=3"]
    with pytest.raises(
        ConfigError,
        match=r"llm.stages.judge-negatives.max_usd caps spend.*"
        r"model 'big' \(used by judge-negatives\)",
    ):
        load_config("dry-run", overrides=[*priced, *other], env={})
    assert load_config("dry-run", overrides=[*priced, "llm.stages.dedup.max_usd=3"], env={})
    with pytest.raises(ConfigError, match=r"llm.max_usd: Input should be greater than 0"):
        load_config("dry-run", overrides=[*priced, "llm.max_usd=0"], env={})
    with pytest.raises(ConfigError, match="spend caps cover the build's LLM stages.*not rewrite"):
        load_config("dry-run", overrides=[*priced, "llm.stages.rewrite.max_usd=3"], env={})

    base = load_config("dry-run", overrides=priced, env={}).section_hash("llm")
    capped = ["llm.max_usd=10", "llm.stages.dedup.max_usd=3"]
    assert load_config("dry-run", overrides=[*priced, *capped], env={}).section_hash("llm") == base


def test_the_cluster_profile_prices_every_model_it_names_under_its_cap():
    cfg = load_config("cluster", env={})
    assert cfg.llm.max_usd is not None and cfg.mining.base_per_field is not None
    models = {cfg.llm.for_stage(s)[0] for s in BUILD_LLM_STAGES}
    assert models == {
        "Qwen/Qwen3-32B",
        "meta-llama/Llama-3.3-70B-Instruct",
        "google/gemma-3-27b-it",
    }
    assert all(cfg.llm.prices[m].input_per_mtok > 0 for m in models)
