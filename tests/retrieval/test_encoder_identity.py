"""The keys cached work is found by stay what they were: a document's vectors (the vector store,
the search index), query vectors, a training run's identity and a stage's config fingerprint are
keyed by hashes of the encoder's settings, so a change to how those settings are described
(the `encoder:` section and the spec made from it) that moved a hash would make every cached
vector stale and every resumed training run refuse to resume. The values are those of the
release before the config section and the spec became one description."""

import pytest
from pydantic import ValidationError

from cpr_ray.config import EncoderConfig, EncoderSettings, load_config
from cpr_ray.retrieval.spec import (
    EncoderSpec,
    RetrieverOptions,
    identity_key,
    query_identity,
    run_identity,
    vector_identity,
    with_identity,
)
from cpr_ray.retrieval.vector_store import store_key
from cpr_ray.train.trainer import OPERATIONAL

# every setting of the section that a spec holds, away from its default
TUNED = EncoderConfig.model_validate(
    {
        "model": "org/encoder",
        "pooling": "cls",
        "query_prefix": "q: ",
        "doc_prefix": "d: ",
        "max_length": 256,
        "batch_size": 8,
        "dtype": "bfloat16",
        "device": "cpu",
        "trust_remote_code": True,
        "revision": "v1",
    }
)


def keys(spec: EncoderSpec) -> tuple[str, ...]:
    train = load_config(env={}).train.model_dump(mode="json", exclude=OPERATIONAL)
    return (
        identity_key(vector_identity(spec)),
        identity_key(query_identity(spec)),
        store_key(spec),
        store_key(spec, "splade"),
        store_key(spec, side="queries"),
        run_identity(spec, examples="e", train=train),
    )


def test_a_default_encoders_keys_are_pinned():
    spec = EncoderSpec.from_config(EncoderConfig(model="org/encoder"))
    assert keys(spec) == (
        "33793935ec0ac57f",
        "1806a425b4f57c87",
        "e38b88bedafda120",
        "130a862566e9350c",
        "queries-e264420705e4e53b",
        "a380332f1e9d6c6e",
    )


def test_a_tuned_encoders_keys_are_pinned():
    spec = EncoderSpec.from_config(TUNED, token_budget=4096, threads=2, normalize=False)
    assert keys(spec) == (
        "f904ed96547a48ed",
        "8ecd2f365064d687",
        "2cacdb9d2ef11de3",
        "4296cf64f814a2e3",
        "queries-16aa1ca1dfb13639",
        "d915df553cdf9192",
    )


def test_a_read_index_keeps_its_vectors_identity_and_runs_as_its_reader_says():
    built = EncoderSpec.from_config(TUNED, token_budget=4096, threads=2)
    reader = EncoderSpec.from_config(EncoderConfig(), device="cuda", batch_size=64)
    read = with_identity(query_identity(built), reader, "the index's model")
    assert query_identity(read) == query_identity(built)
    assert (read.device, read.batch_size, read.threads, read.token_budget) == (
        "cuda",
        64,
        None,
        None,
    )
    assert read.trust_remote_code is False  # the reader's, never the index's


def test_stage_fingerprints_of_the_sections_are_pinned():
    # the defaults and the cluster profile (hub names only: the dry-run profile names the bundled
    # MiniLM by its path in the venv, which moves its hash from one checkout to the next); both
    # computed at a6af272, before the encoder's section and spec became one description
    cfg, cluster = load_config(env={}), load_config("cluster", env={})
    sections = ("encoder", "pooling", "train", "search", "fusion", "eval")
    assert [cfg.section_hash(name) for name in sections] == [
        "aa73ca0a1a3b214f",
        "b2e30f092dc23d6b",
        "bf8f9d551dc4f348",
        "94e99acd8e004bcd",
        "7bc4612e7a36b598",
        "51074b3cd71c4bee",
    ]
    assert cluster.section_hash(*sections) == "cbfd16d86f25aabf"


def test_the_spec_and_the_actor_pool_take_every_setting_the_section_names():
    settings = set(EncoderSettings.model_fields)
    spec = EncoderSpec.from_config(TUNED)
    assert spec.model_dump(include=settings) == TUNED.model_dump(include=settings)
    actors = {"actors": 3, "cpus_per_actor": 2.0, "gpus_per_actor": 1.0}
    encoder = TUNED.model_copy(update={**actors, "resources_per_actor": {"gpu_node": 1.0}})
    cfg = load_config(env={}).model_copy(update={"encoder": encoder})
    pool = RetrieverOptions.from_config(cfg).ray
    assert pool.model_dump(include=set(actors)) == actors
    assert pool.ray_resources() == {
        "num_cpus": 2.0,
        "num_gpus": 1.0,
        "resources": {"gpu_node": 1.0},
    }


@pytest.mark.parametrize("bad", [{"pooling": "max"}, {"dtype": "int8"}, {"max_length": 4}])
def test_a_spec_refuses_what_the_section_refuses_in_the_same_words(bad):
    with pytest.raises(ValidationError) as section:
        EncoderConfig(**bad)
    with pytest.raises(ValidationError) as spec:
        EncoderSpec(model="m", **bad)
    assert spec.value.errors()[0]["msg"] == section.value.errors()[0]["msg"]
