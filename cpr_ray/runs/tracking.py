"""Experiment tracking in MLflow (the `tracking:` section): the one module that talks to it.

`cpr train` logs one MLflow run per training OUT: the resolved `train:`/`encoder:` settings, the
examples' fingerprint and the card's facts about the data as parameters; rank 0's metrics of
every step (the driver logs the rows rank 0 sends it, so each step is logged once); on completion
each worker's peak memory and the model folder with its card as artifacts. The run's id is kept
in ``OUT/mlflow.json``, so a resumed run (a rerun of the same OUT, or a worker group restarted
from a checkpoint) continues the same MLflow run and logs only the steps after its last logged.
The card names the run (``mlflow:`` in its front matter), and `cpr eval` of that model
(`log_evaluation`, from `publish.publish`) logs each benchmark's metrics, intervals, random
baseline and results files into it; a model not trained by `cpr train` gets a run of its own.

Where: ``tracking.uri``, else ``MLFLOW_TRACKING_URI``, else ``sqlite:///…/mlruns.db`` beside the
outputs when they are local (MLflow 3 keeps its file store in maintenance mode and refuses it by
default; SQLite is its local default), artifacts in ``mlartifacts/`` beside that database.

Tracking never costs a run: MLflow not installed where tracking was asked for, a store MLflow
refuses (its file store, in maintenance mode since MLflow 3), a locked SQLite file or a server
that cannot be reached or answers 500 is one `tracking:` line saying what to change, and the
command goes on untracked.
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
import tempfile
from dataclasses import dataclass
from typing import Any

from rich.markup import escape

from cpr_ray.config import Config, TrackingConfig
from cpr_ray.runs.stage_runner import console
from cpr_ray.storage.store import Storage, join

EXTRA = "pip install 'cpr-ray[tracking]'"
RECORD = "mlflow.json"  # under a training OUT: the MLflow run it logs into
DB, ARTIFACTS = "mlruns.db", "mlartifacts"
STEP_METRICS = ("loss", "accuracy", "lr", "grad_norm", "pairs_per_s")
EVAL_BLOCK = ("value", "ci_low", "ci_high", "random")
# MLflow retries a failed request 7 times with exponential backoff (minutes); a server that does
# not answer should cost a run seconds. Set only where the user has not set them.
HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}


def _warn(message: str) -> None:
    console.print(f"[yellow]tracking[/]: {escape(message)}", soft_wrap=True, highlight=False)


def store_uri(tc: TrackingConfig, beside: str | None) -> str | None:
    """The tracking URI: the config's, the environment's, else a SQLite store in the local
    folder `beside` (the outputs); None: nowhere to log (tracking off, or outputs on S3)."""
    if not tc.enabled:
        return None
    if tc.uri or os.environ.get("MLFLOW_TRACKING_URI"):
        return tc.uri or os.environ["MLFLOW_TRACKING_URI"]
    if beside is None or "://" in beside:
        return None
    return f"sqlite:///{os.path.abspath(os.path.join(beside, DB))}"


def _asked(tc: TrackingConfig) -> bool:
    """Tracking set up by the user, not just left at its default store."""
    return tc.enabled and bool(tc.uri or os.environ.get("MLFLOW_TRACKING_URI"))


@dataclass
class TrackedRun:
    """One MLflow run being logged into. After the first failure every call is a no-op: the
    warning has been said once, and the work it tracks goes on."""

    uri: str
    run_id: str
    client: Any  # mlflow.MlflowClient
    last_step: int = 0  # the last step logged: a resumed run logs only the ones after it
    broken: bool = False

    def call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if self.broken:
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - tracking never costs a run
            self.broken = True
            _warn(f"{what} failed at {self.uri}: {_short(exc)}{_advice(self.uri, exc)}")
            return None

    def log_params(self, params: dict[str, Any]) -> None:
        """`params` not logged yet (MLflow refuses a parameter logged again with another value:
        a resumed run may change how it runs, e.g. its workers; the first value stays)."""
        from mlflow.entities import Param

        run = self.call("reading the run", self.client.get_run, self.run_id)
        if run is None:
            return
        new = [
            Param(_key(k), str(v)[:6000])
            for k, v in params.items()
            if _key(k) not in run.data.params
        ]
        for i in range(0, len(new), 100):  # MLflow takes at most 100 parameters a batch
            self.call(
                "logging parameters", self.client.log_batch, self.run_id, params=new[i : i + 100]
            )

    def log_metrics(self, metrics: dict[str, float], step: int = 0) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(_key(k), float(v), now, step) for k, v in metrics.items() if v is not None]
        self.call("logging metrics", self.client.log_batch, self.run_id, metrics=batch)

    def log_files(self, storage: Storage, uris: list[str], artifact_path: str) -> None:
        """Files or folders (local or s3://) as the run's artifacts under `artifact_path` (a
        folder under its own name there)."""
        with tempfile.TemporaryDirectory(prefix="cpr-tracking-") as tmp:
            for uri in uris:
                local = _local(storage, uri, tmp)
                if os.path.isdir(local):
                    where = posixpath.join(artifact_path, os.path.basename(local.rstrip("/")))
                    self.call(
                        "logging artifacts", self.client.log_artifacts, self.run_id, local, where
                    )
                else:
                    self.call(
                        "logging artifacts",
                        self.client.log_artifact,
                        self.run_id,
                        local,
                        artifact_path or None,
                    )

    def end(self) -> None:
        self.call("ending the run", self.client.set_terminated, self.run_id)


def _short(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def _advice(uri: str, exc: BaseException) -> str:
    """What to change, for the stores users meet failing most; always ends 'going on untracked'
    (the command does)."""
    text = str(exc)
    if "maintenance mode" in text or uri.startswith("file:") or "://" not in uri:
        db = posixpath.join(posixpath.dirname(uri.removeprefix("file://").rstrip("/")), DB)
        change = (
            f"MLflow refuses its file store: set tracking.uri (or MLFLOW_TRACKING_URI) to "
            f"sqlite:///{db.lstrip('/') if db.startswith('//') else db}, or "
            "MLFLOW_ALLOW_FILE_STORE=true to keep the file store"
        )
    elif "database is locked" in text:
        change = "another process holds the SQLite store: give this run its own tracking.uri"
    elif uri.startswith(("http://", "https://")):
        change = "check the tracking server, or set tracking.enabled=false"
    else:
        change = "check tracking.uri, or set tracking.enabled=false"
    return f" ({change}); going on untracked"


def _key(name: str) -> str:
    """A name MLflow takes as a metric or parameter key."""
    return re.sub(r" +", " ", re.sub(r"[^\w.\- /:]", "", name)).strip() or "_"


def _local(storage: Storage, uri: str, tmp: str) -> str:
    """A local path holding `uri`'s file or folder (a download when it is on S3)."""
    loc = storage.resolve(uri)
    if not loc.is_s3:
        return loc.path
    import pyarrow.fs as pafs

    local = os.path.join(tmp, posixpath.basename(loc.path.rstrip("/")))
    folder = storage.file_type(loc.uri) == pafs.FileType.Directory
    os.makedirs(local if folder else tmp, exist_ok=True)
    pafs.copy_files(loc.path, local, source_filesystem=loc.fs)
    return local


def _client(tc: TrackingConfig, uri: str) -> Any:
    """MLflow's client for `uri`, or None (one line) where MLflow is not installed."""
    try:
        from mlflow import MlflowClient
    except ImportError:
        if _asked(tc):
            _warn(f"MLflow is not installed; install the tracking extra: {EXTRA}")
        return None
    for name, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(name, value)
    # "Creating initial MLflow database tables..." on a new store, and the traceback it logs
    # for a locked one: not the user's business, the `tracking:` line says what to change
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    try:
        return MlflowClient(tracking_uri=uri)
    except Exception as exc:  # noqa: BLE001 - a store MLflow refuses never costs a run
        _warn(f"cannot log to {uri}: {_short(exc)[:80]}…{_advice(uri, exc)}")
        return None


def open_run(
    tc: TrackingConfig,
    uri: str | None,
    *,
    run_id: str | None = None,
    name: str | None = None,
    tags: dict[str, str] | None = None,
) -> TrackedRun | None:
    """The run `run_id` at `uri` (reopened), or a new one in ``tracking.experiment``; None
    where there is nowhere to log or it fails (one line)."""
    if uri is None:
        return None
    client = _client(tc, uri)
    if client is None:
        return None
    run = TrackedRun(uri, run_id or "", client)
    if run_id:
        run.call("reopening the run", client.update_run, run_id, status="RUNNING")
        return None if run.broken else run

    def create() -> str:
        experiment = client.get_experiment_by_name(tc.experiment)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:  # a local store's artifacts beside its database, not in the working directory
            db = uri.removeprefix("sqlite:///") if uri.startswith("sqlite:///") else None
            place = os.path.join(os.path.dirname(os.path.abspath(db)), ARTIFACTS) if db else None
            experiment_id = client.create_experiment(tc.experiment, artifact_location=place)
        return client.create_run(experiment_id, run_name=name, tags=tags or {}).info.run_id

    created = run.call("starting a run", create)
    if created is None:
        return None
    run.run_id = created
    return run


# -- training --------------------------------------------------------------------------------------


def start_training(
    cfg: Config, storage: Storage, out: str, params: dict[str, Any]
) -> TrackedRun | None:
    """The training run's MLflow run: the one ``OUT/mlflow.json`` names (a resumed run), else a
    new one; its parameters logged, and its last logged step known."""
    record_uri = join(out, RECORD)
    uri = store_uri(cfg.tracking, out)
    record = storage.read_json(record_uri) if storage.exists(record_uri) else {}
    same = record.get("tracking_uri") == uri
    run = open_run(
        cfg.tracking,
        uri,
        run_id=record.get("run_id") if same else None,
        name=f"cpr train {posixpath.basename(out.rstrip('/'))}",
        tags={"cpr.command": "train", "cpr.out": out},
    )
    if run is None:
        return None
    if not same:
        storage.write_json(record_uri, {"tracking_uri": uri, "run_id": run.run_id})
    history = run.call("reading the run", run.client.get_metric_history, run.run_id, "loss")
    run.last_step = max((m.step for m in history or ()), default=0)
    run.log_params(params)
    return run


def training_params(cfg: Config, fingerprint: str) -> dict[str, Any]:
    """The resolved `train:` and `encoder:` settings, flat, and the examples' fingerprint."""
    flat = {"data.fingerprint": fingerprint}
    for section in ("train", "encoder"):
        flat.update(_flatten(getattr(cfg, section).model_dump(mode="json"), section))
    return flat


def _flatten(value: Any, prefix: str) -> dict[str, Any]:
    if isinstance(value, dict):
        return {
            k: v for key, sub in value.items() for k, v in _flatten(sub, f"{prefix}.{key}").items()
        }
    return {prefix: value}


def log_step(run: TrackedRun | None, row: dict[str, Any]) -> None:
    """One step's metrics (rank 0's row); a step already logged (a restart redoes the steps
    after its checkpoint) is not logged again."""
    if run is None or row["step"] <= run.last_step:
        return
    run.log_metrics({k: row[k] for k in STEP_METRICS if k in row}, step=row["step"])
    run.last_step = row["step"]


def finish_training(
    run: TrackedRun | None, storage: Storage, summary: dict[str, Any], facts: Any
) -> None:
    """The finished run: the card's facts about the data, workers and strategy as parameters,
    each worker's peak memory, the model folder (its card inside) as artifacts; then ended."""
    if run is None:
        return
    data = facts.data
    params: dict[str, Any] = {
        "workers": summary["workers"],
        "strategy": summary["strategy"],
        "data.format": data.format,
        "data.uri": data.uri,
    }
    for key in ("export_id", "built", "release"):
        if getattr(data, key):
            params[f"data.{key}"] = getattr(data, key)
    params.update({f"data.{what}": n for what, n in data.counts})
    run.log_params(params)
    peaks = summary.get("peak_memory_mb_per_worker") or []
    run.log_metrics(
        {f"peak_memory_mb/worker_{i}": p for i, p in enumerate(peaks)}, step=summary["steps"]
    )
    run.log_files(storage, [summary["model"]], "")
    run.end()


# -- evaluation ------------------------------------------------------------------------------------


def card_run(storage: Storage, card_uri: str | None) -> dict[str, str] | None:
    """The MLflow run a cpr-ray model card names (``mlflow:`` in its front matter)."""
    from cpr_ray.cards.model_card import split_card

    if card_uri is None:
        return None
    parts = split_card(storage.read_text(card_uri))
    named = parts[0].get("mlflow") if parts else None
    return named if isinstance(named, dict) and named.get("run_id") else None


def log_evaluation(cfg: Config, storage: Storage, published: Any) -> None:
    """A published evaluation (`publish.Published`) into its model's training run when the
    model's card names one, else into a run of its own: each metric's value, interval and
    random baseline, and the results files."""
    tc = cfg.tracking
    if not tc.enabled:
        return
    res = published.results
    named = card_run(storage, published.card_uri)
    bench = "/".join(str(p) for p in (res["benchmark"], res.get("subset")) if p)
    if named:
        run = open_run(tc, named["uri"], run_id=named["run_id"])
    else:
        out = cfg.eval.out
        beside = posixpath.dirname(out) if out and out.endswith(".json") else out
        run = open_run(
            tc,
            store_uri(tc, beside),
            name=f"cpr eval {bench} {res['retriever']}",
            tags={"cpr.command": "eval", "cpr.model": str(res.get("model") or "")},
        )
    if run is None:
        return
    prefix = f"eval/{bench}"
    metrics: dict[str, float] = {f"{prefix}/n_queries": res["n_queries"]}
    for name, block in res.items():
        if isinstance(block, dict) and all(k in block for k in EVAL_BLOCK):
            for k in EVAL_BLOCK:
                metrics[f"{prefix}/{name}" + ("" if k == "value" else f"/{k}")] = block[k]
    run.log_metrics(metrics)
    files = [u for u in (published.results_uri, published.mteb_uri) if u]
    if published.mteb_uri:
        meta = join(posixpath.dirname(published.mteb_uri), "model_meta.json")
        files += [meta] if storage.exists(meta) else []
    run.log_files(storage, files, prefix)
    run.end()
