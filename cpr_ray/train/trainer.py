"""The training run: Ray Train's TorchTrainer over the one encoder, any number of CPU or GPU
workers, checkpoints in object storage, resume, and the final sentence-transformers model.

The driver reads and checks the data (an `InputError` before any worker starts), writes the
examples it will train on to ``OUT/examples.parquet`` and the run's identity to ``OUT/run.json``,
then starts the workers. Every worker takes an equal share of each global batch (the batches are
a fixed function of the seed and the step), so a run resumed from a checkpoint continues with
the step it stopped at, on the same batches, and the dropout of each step is seeded by
(seed, step, rank) too.

Layout under OUT (a path or ``s3://…``, endpoint from ``storage.s3_endpoint``):

- ``run/checkpoint_*/``: Ray Train checkpoints, the newest ``train.keep_checkpoints``: the model
  (or a LoRA run's adapters, or fsdp's sharded state) and ``state.pt`` (``checkpoints.py``);
- ``metrics.jsonl``: one line per step (loss, in-batch accuracy, lr, grad norm, pairs/s), written
  with every checkpoint; rank 0 also prints each step as it ends;
- ``model/``: the final model, which ``SentenceTransformer(path)`` loads and ``cpr eval
  --retriever dense --model PATH`` evaluates with the training's pooling and instructions (a
  LoRA run's adapters merged into the base weights: a plain model, loaded without peft), with
  its model card ``README.md`` (``model_card.py``), written by the driver just before the summary;
- ``workers.json``: each worker's peak memory, the last step's metrics and rank 0's device;
- ``mlflow.json``: the MLflow run this OUT logs into, which a resumed run continues
  (`cpr_ray.runs.tracking`; ``mlruns.db`` and ``mlartifacts/`` beside it: the default local store);
- ``train.json``: the summary, written last: a run whose summary exists is not trained again.

Rerunning with the same OUT resumes from the newest whole checkpoint under ``OUT/run``; within
one run a failed worker group (a lost node) restarts from it up to ``train.max_failures``
times (`checkpoints.newest_checkpoint` says why storage, not Ray Train's registry, decides
which). A sharded run's final ``model/`` is gathered whole on rank 0 and saved as a DDP run's is.
"""

from __future__ import annotations

import functools
import os
import resource
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from cpr_ray.config import Config, TrainConfig
from cpr_ray.errors import ConfigError, InputError, UserError
from cpr_ray.retrieval.encoder import Encoder, with_instructions
from cpr_ray.retrieval.model_source import model_config
from cpr_ray.retrieval.spec import EncoderSpec, run_identity
from cpr_ray.runs import tracking
from cpr_ray.runs.stage_runner import console
from cpr_ray.storage import leases
from cpr_ray.storage.store import Storage, StorageConfig, join
from cpr_ray.train.card_facts import device_name, training_facts, write_training_card
from cpr_ray.train.checkpoints import (
    ADAPTER_DIR,
    METRICS_FILE,
    MODEL_DIR,
    RUN_NAME,
    SHARDED_DIR,
    newest_checkpoint,
    save_checkpoint,
    upload,
)
from cpr_ray.train.data import read_examples
from cpr_ray.train.examples import DataOptions, fingerprint
from cpr_ray.train.lora import (
    add_adapters,
    load_adapter,
    load_trainable_state,
    merge,
)
from cpr_ray.train.memory_plan import check_plan_fits
from cpr_ray.train.sharding import (
    FetchingReader,
    full_state_dict,
    load_sharded,
    shard,
)
from cpr_ray.train.step import Examples, Towers, configured_step, freeze_unused, global_batch_rows

EXAMPLES_FILE, RUN_FILE = "examples.parquet", "run.json"
WORKERS_FILE, SUMMARY_FILE = "workers.json", "train.json"
# train keys that change how a run is carried out, not what it computes: a resumed run may
# change them
OPERATIONAL = {
    "data",  # where the data is: its content is in the identity
    "reasonir_documents",
    "out",
    "max_steps",  # a resumed run may go on for longer
    "workers",
    "use_gpu",
    "cpus_per_worker",
    "checkpoint_every",
    "keep_checkpoints",
    "max_failures",
    "gpu_memory_gb",
}

StepHook = Callable[[int, int], None]


@dataclass(frozen=True)
class TrainPlan:
    """Everything a worker needs, as plain values (it travels to the Ray Train workers)."""

    # the encoder trained: the base model, its pooling as configured, the weights' dtype, the
    # loading settings, train.max_length, and the instructions it trains with and saves
    spec: EncoderSpec
    out: str
    storage: StorageConfig
    train: TrainConfig
    examples: int  # rows of OUT/examples.parquet
    negatives: int  # hard-negative slots per query (the most any query has)
    steps_per_epoch: int
    total_steps: int  # steps this run trains (train.max_steps caps the schedule's)

    @property
    def schedule_steps(self) -> int:
        return self.steps_per_epoch * self.train.epochs

    @property
    def prefixes(self) -> tuple[str, str]:
        return self.spec.query_prefix or "", self.spec.doc_prefix or ""

    def encoder(self, path: str | None = None) -> Encoder:
        """The model at `path` (the base, or a checkpoint's) as this run trains it."""
        return Encoder.build(self.spec.with_updates(model=path) if path else self.spec)


def _peak_memory_mb() -> float:
    """This process's peak memory: resident set on CPU, allocated device memory on GPU."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _step_seed(seed: int, step: int, rank: int) -> int:
    return int(np.random.SeedSequence([seed, step, rank]).generate_state(1)[0])


def _progress(row: dict[str, Any], total: int) -> str:
    return (
        f"[cpr train] step {row['step']}/{total} loss {row['loss']:.4f} "
        f"acc {row['accuracy']:.3f} lr {row['lr']:.2e} {row['pairs_per_s']:.1f} pairs/s"
        + (" (gradient cache)" if row["gradient_cache"] else "")
    )


def train_worker(config: dict[str, Any]) -> None:
    """The loop every Ray Train worker runs."""
    import ray.train
    import ray.train.torch

    plan: TrainPlan = config["plan"]
    on_step: StepHook | None = config.get("on_step")
    progress = config.get("progress")  # a ray.util.queue.Queue the driver prints from
    tc = plan.train
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    assert tc.cpus_per_worker is not None  # _placed sets it before the workers start
    torch.set_num_threads(max(1, int(tc.cpus_per_worker)))
    storage = Storage(plan.storage)
    examples = Examples(storage.read_parquet(join(plan.out, EXAMPLES_FILE)), plan.negatives)

    sharded, adapted = tc.strategy == "fsdp", tc.lora is not None
    with tempfile.TemporaryDirectory(prefix="cpr-train-") as tmp:
        restored = newest_checkpoint(storage, plan.out, os.path.join(tmp, "restored"))
        model_path = None  # the base model
        # a restart, or a rerun of the same OUT; a LoRA run's base is always the base model
        if restored is not None and not sharded and not adapted:
            model_path = os.path.join(restored.folder, MODEL_DIR)
        encoder = plan.encoder(model_path)
        freeze_unused(encoder)
        if tc.lora is not None:  # before checkpointing, DDP and sharding, which see adapters
            add_adapters(encoder, tc.lora, tc.seed)
            if restored is not None and not sharded:
                load_adapter(encoder, os.path.join(restored.folder, ADAPTER_DIR))
        if tc.gradient_checkpointing:  # before sharding: it changes how blocks are called
            encoder.backbone.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        if sharded:  # Ray Train has set this worker's CUDA device, which the mesh takes
            model = shard(Towers(encoder), ray.train.torch.get_device(), tc.bf16)
        else:
            model = ray.train.torch.prepare_model(Towers(encoder))  # device, DDP when W > 1
        # built after sharding, over the DTensor shards: each worker steps its own slice
        step = configured_step(model, encoder, tc, plan.schedule_steps, plan.prefixes)
        optimizer, scheduler = step.optimizer, step.scheduler
        start, history = 0, []
        if restored is not None:
            state = restored.state
            if sharded:  # the base model's weights (LoRA: the adapters) become the checkpoint's
                fetch = functools.partial(restored.fetch_sharded, storage)
                reader = FetchingReader(os.path.join(restored.folder, SHARDED_DIR), fetch)
                load_sharded(model, optimizer, reader, trainable_only=adapted)
            else:
                optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            start, history = state["step"], state["history"]
        share = tc.batch_size // world
        for s in range(start, plan.total_steps):
            torch.manual_seed(_step_seed(tc.seed, s, rank))
            rows = global_batch_rows(plan.examples, tc.batch_size, tc.seed, s)
            metrics = step(examples.batch(rows[rank * share : (rank + 1) * share]))
            epoch = s // plan.steps_per_epoch + 1
            row = {"step": s + 1, "epoch": epoch, **metrics, "resumed_from": start}
            if rank == 0:
                history.append(row)
                if progress is not None:
                    progress.put(row)
            if on_step is not None:
                on_step(s + 1, rank)
            if (s + 1) % tc.checkpoint_every == 0 or s + 1 == plan.total_steps:
                save_checkpoint(
                    storage,
                    step,
                    s + 1,
                    history,
                    out=plan.out,
                    rank=rank,
                    tmp=tmp,
                    sharded=sharded,
                    adapted=adapted,
                    prefixes=plan.prefixes,
                )

        peaks: list[float | None] = [_peak_memory_mb()]
        if world > 1:
            peaks = [None] * world
            dist.all_gather_object(peaks, _peak_memory_mb())
        # every worker sends its slices (LoRA: of the adapters; the base is the base model's)
        whole = full_state_dict(model, trainable_only=adapted) if sharded else {}
        if rank == 0:
            final = os.path.join(tmp, "final")
            saved = encoder
            if sharded:  # the same weights, whole, in a plain encoder
                saved = plan.encoder()
                if tc.lora is not None:
                    add_adapters(saved, tc.lora, tc.seed)
                    load_trainable_state(Towers(saved), whole)
                else:
                    Towers(saved).load_state_dict(whole)
            if adapted:  # the output is a plain model: the adapters go into its weights
                saved = merge(saved)
            query_prefix, doc_prefix = plan.prefixes
            saved.save_sentence_transformers(
                final, query_prefix=query_prefix, doc_prefix=doc_prefix
            )
            upload(storage, final, join(plan.out, MODEL_DIR))
            last = history[-1] if history else {}
            workers = {"peak_memory_mb": peaks, "last": last, "device": device_name(encoder.device)}
            storage.write_json(join(plan.out, WORKERS_FILE), workers)


def _trainer(
    plan: TrainPlan, storage: Storage, on_step: StepHook | None, progress: Any = None
) -> Any:
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    tc = plan.train
    loc = storage.resolve(plan.out)
    return TorchTrainer(
        train_worker,
        train_loop_config={"plan": plan, "on_step": on_step, "progress": progress},
        scaling_config=ScalingConfig(
            num_workers=tc.workers, use_gpu=tc.use_gpu, resources_per_worker=worker_resources(tc)
        ),
        run_config=RunConfig(
            name=RUN_NAME,
            storage_path=loc.path,
            storage_filesystem=loc.folderless_fs() if loc.is_s3 else None,
            checkpoint_config=CheckpointConfig(num_to_keep=tc.keep_checkpoints),
            failure_config=FailureConfig(max_failures=tc.max_failures),
        ),
    )


def worker_resources(tc: TrainConfig) -> dict[str, float]:
    """What each Ray Train worker reserves (`cpus_per_worker` placed, see `_placed`): its CPUs,
    a GPU with `use_gpu`, and the custom resources that keep it on the GPU node type."""
    assert tc.cpus_per_worker is not None  # _placed sets it first
    resources: dict[str, float] = {"CPU": tc.cpus_per_worker}
    if tc.use_gpu:
        resources["GPU"] = 1
    return {**resources, **tc.resources_per_worker}


def _worker_user_error(exc: BaseException) -> UserError | None:
    from cpr_ray.runs.ray_runtime import user_error_in

    for failure in getattr(exc, "worker_failures", {}).values():
        found = user_error_in(failure)
        if found is not None:
            return found
    return user_error_in(exc)


def _on_cluster(cfg: Config) -> bool:
    return bool(cfg.ray.address or os.environ.get("RAY_ADDRESS"))


def default_cpus_per_worker(cfg: Config, free_cpus: float) -> float:
    """`train.cpus_per_worker` unset: on a local Ray (a laptop, the dry run) the workers share
    the CPUs Ray has free as the run starts (`free_cpus`), so a 1-worker run uses every core
    rather than one, and a run beside other Ray work (a service, a test's actors) asks only for
    what is free: Ray Train waits for ever for CPUs that never come free. On GPU workers or a
    cluster, 1 (the GPU does the work, and the driver cannot see a worker node's CPUs)."""
    if cfg.train.use_gpu or _on_cluster(cfg):
        return 1.0
    return float(max(1, int(free_cpus) // cfg.train.workers))


def check_local_capacity(tc: TrainConfig, total_cpus: float, free_cpus: float) -> None:
    """A local Ray never grows: a run asking for more CPUs than it has would wait for ever (Ray
    Train retries the worker group's start without end), so it stops here with the setting to
    change; one asking for CPUs that other work holds says what it waits for."""
    wanted = tc.workers * (tc.cpus_per_worker or 1.0)
    if wanted > total_cpus:
        raise ConfigError(
            f"train.workers {tc.workers} x train.cpus_per_worker {tc.cpus_per_worker:g} = "
            f"{wanted:g} CPUs, more than the {total_cpus:g} this local Ray has: lower "
            "train.cpus_per_worker or train.workers, or give ray.address of a bigger cluster"
        )
    if wanted > free_cpus:
        console.print(
            f"[cpr train] waiting for {wanted:g} CPUs: other Ray work holds "
            f"{total_cpus - free_cpus:g} of this local Ray's {total_cpus:g}",
            markup=False,
            highlight=False,
        )


def _placed(cfg: Config, tc: TrainConfig) -> TrainConfig:
    """The run's CPUs per worker, known once Ray is up (see `default_cpus_per_worker`)."""
    import ray

    local = not _on_cluster(cfg)
    free = ray.available_resources().get("CPU", 0.0) if local else 0.0
    if tc.cpus_per_worker is None:
        tc = tc.model_copy(update={"cpus_per_worker": default_cpus_per_worker(cfg, free)})
    if local and not tc.use_gpu:
        check_local_capacity(tc, ray.cluster_resources().get("CPU", 0.0), free)
    return tc


@contextmanager
def _own_sigint() -> Iterator[None]:
    """Ray Train's `fit` installs a SIGINT handler that aborts its controller and never removes
    it: a Ctrl-C in a later stage of the same process (the dry run evaluates after training)
    would go to a finished run's controller instead of raising KeyboardInterrupt there."""
    handler = signal.getsignal(signal.SIGINT)
    try:
        yield
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, handler)


def prepare_run(cfg: Config, storage: Storage) -> tuple[TrainPlan, dict[str, Any]]:
    """Check the inputs, write the examples and the run's identity; the plan the workers run."""
    cfg.require("train.data", "train.out", "encoder.model")
    tc = cfg.train
    assert tc.out is not None
    spec = EncoderSpec.from_config(cfg.encoder, max_length=tc.max_length)
    # a model that cannot be found, or whose own code may not run, fails now, not after the
    # workers started
    model_config(spec)
    examples, stats = read_examples(storage, DataOptions.from_config(tc))
    if examples.num_rows < tc.batch_size:
        raise InputError(
            f"{tc.data}: {examples.num_rows} training examples after filtering, fewer than one "
            f"batch (train.batch_size {tc.batch_size})"
        )
    out = storage.resolve(tc.out).uri
    spec = with_instructions(spec)
    stats = {**stats, "fingerprint": fingerprint(examples)}
    identity = run_identity(
        spec,
        examples=stats["fingerprint"],
        train=tc.model_dump(mode="json", exclude=OPERATIONAL),
    )
    run_uri = join(out, RUN_FILE)
    if storage.exists(run_uri) and storage.read_json(run_uri)["identity"] != identity:
        raise ConfigError(
            f"{out} holds a run on other data or settings (its {RUN_FILE} differs): give a new "
            "--out, or the same data and train settings to resume it"
        )
    # before run.json is written: a rerun with the setting the check names is the same run
    check_plan_fits(spec, tc, negatives=stats["max_negatives"])
    steps_per_epoch = -(-examples.num_rows // tc.batch_size)  # the last batch wraps around
    total = steps_per_epoch * tc.epochs
    negatives = stats["max_negatives"]
    plan = TrainPlan(
        spec=spec,
        out=out,
        storage=cfg.storage,
        train=tc,
        examples=examples.num_rows,
        negatives=negatives,
        steps_per_epoch=steps_per_epoch,
        total_steps=min(total, tc.max_steps or total),
    )
    storage.write_parquet(examples, join(out, EXAMPLES_FILE))
    storage.write_json(
        run_uri,
        {
            "identity": identity,
            "model": spec.model,
            "query_prefix": plan.prefixes[0],
            "doc_prefix": plan.prefixes[1],
            "data": stats,
            "steps": plan.total_steps,
            "steps_per_epoch": steps_per_epoch,
        },
    )
    return plan, stats


@contextmanager
def _printed_progress(total: int, tracked: tracking.TrackedRun | None) -> Iterator[Any]:
    """A queue rank 0 puts each step's metrics on, printed here by the driver: one line per step
    on the user's console, while the workers' own output (and Ray Train's) stays in Ray's logs.
    Each row is logged to the run's MLflow run here too: rank 0's, once per step.

    The queue's actor lives on the driver's node (`on_this_node`): anywhere else, losing that
    node would fail the run for want of a progress line."""
    from ray.util.queue import Empty, Queue

    from cpr_ray.runs.ray_runtime import on_this_node

    queue = Queue(actor_options={"num_cpus": 0, "scheduling_strategy": on_this_node()})
    done = threading.Event()

    def drain(block: bool) -> None:
        while True:
            try:
                row = queue.get(block=block, timeout=0.5)
            except Empty:
                return
            console.print(_progress(row, total), markup=False, highlight=False)
            tracking.log_step(tracked, row)

    def printer() -> None:
        while not done.is_set():
            drain(block=True)

    thread = threading.Thread(target=printer, name="cpr-train-progress", daemon=True)
    thread.start()
    try:
        yield queue
    finally:
        done.set()
        thread.join(timeout=5)
        drain(block=False)
        queue.shutdown()


def run_train(cfg: Config, *, on_step: StepHook | None = None) -> dict[str, Any]:
    """Train as configured and return the summary (also written to OUT/train.json).

    `on_step(step, rank)` runs on every worker after each step (a test uses it to make a worker
    fail once). A run whose summary exists returns it without training.
    """
    storage = Storage(cfg.storage)
    cfg.require("train.out")
    assert cfg.train.out is not None
    if storage.resolve(cfg.train.out).is_s3:
        storage.check_writable(cfg.train.out)  # a prefix it may not write: one line, now
    summary_uri = join(storage.resolve(cfg.train.out).uri, SUMMARY_FILE)
    if storage.exists(summary_uri):
        return {**storage.read_json(summary_uri), "skipped": True}
    # the export stays until the card (which reads its stats and card) is written
    with leases.reading(storage, cfg.train.data):
        return _train(cfg, storage, summary_uri, on_step)


def _train(
    cfg: Config, storage: Storage, summary_uri: str, on_step: StepHook | None
) -> dict[str, Any]:
    from cpr_ray.runs.ray_runtime import ensure_ray

    started = time.time()
    plan, stats = prepare_run(cfg, storage)
    ensure_ray(cfg.ray)
    plan = replace(plan, train=_placed(cfg, plan.train))
    params = tracking.training_params(cfg, stats["fingerprint"])
    tracked = tracking.start_training(cfg, storage, plan.out, params)
    try:
        with _own_sigint(), _printed_progress(plan.total_steps, tracked) as progress:
            _trainer(plan, storage, on_step, progress).fit()
    except Exception as exc:
        user = _worker_user_error(exc)
        if user is None:
            raise
        raise user.with_traceback(None) from None
    workers = storage.read_json(join(plan.out, WORKERS_FILE))  # what rank 0 left
    last = workers["last"]
    summary = {
        "model": join(plan.out, MODEL_DIR),
        "metrics": join(plan.out, METRICS_FILE),
        "checkpoints": join(plan.out, RUN_NAME),
        "base_model": plan.spec.model,
        "query_prefix": plan.prefixes[0],
        "doc_prefix": plan.prefixes[1],
        "steps": plan.total_steps,
        "workers": cfg.train.workers,
        "cpus_per_worker": plan.train.cpus_per_worker,
        "strategy": cfg.train.strategy,
        "lora": cfg.train.lora.model_dump(mode="json") if cfg.train.lora else None,
        "data": stats,
        "final": {k: last[k] for k in ("loss", "accuracy", "lr") if k in last},
        "peak_memory_mb_per_worker": workers["peak_memory_mb"],
        "seconds": round(time.time() - started, 1),
        "mlflow": {"uri": tracked.uri, "run_id": tracked.run_id} if tracked else None,
    }
    # the card before the summary: a run cut short between the two writes it on its rerun
    examples = join(plan.out, EXAMPLES_FILE)
    facts = training_facts(storage, cfg, summary, examples=examples, device=workers.get("device"))
    write_training_card(storage, facts)
    tracking.finish_training(tracked, storage, summary, facts)
    storage.write_json(summary_uri, summary)
    return summary
