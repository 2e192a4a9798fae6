"""Starting or joining Ray the same way from the CLI, the jobs and the tests."""

from __future__ import annotations

import logging
import os
import re
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import ray

# imported here, not on first use: importing ray.data configures its console log handler on the
# sys.stderr of that moment, which inside a CLI call made from Python (tests, notebooks) is a
# stream that is closed once the call returns; later datasets would then log into it
import ray.data  # noqa: F401
from ray.exceptions import RayTaskError

from cpr_ray.config import RayConfig
from cpr_ray.errors import UserError

log = logging.getLogger(__name__)


# Ray's own noise that a user of the CLI should not see; each still reaches Ray's log files
QUIET_ENV = {
    "RAY_DEDUP_LOGS": "1",  # one line for a message many workers print
    "LANCE_LOG": "error",  # Lance's Rust "No existing dataset … will be created" warnings
    # each encoder actor's "Loading weights" bar (transformers reads the hub's switch)
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TOKENIZERS_PARALLELISM": "false",  # the tokenizers fork warning in every actor
}


def quiet_ray_console() -> None:
    """Keep Ray's INFO chatter in its log files (session_*/logs/ray-data.log) and off the console.

    Ray Data logs every execution plan and, off a terminal, a progress block every few seconds at
    INFO on the console; our stages print one summary line each instead. On a terminal Ray
    Data's progress bars stay (they are not log records).
    """
    for name, value in QUIET_ENV.items():
        os.environ.setdefault(name, value)
    warnings.filterwarnings("ignore", message="lance is not fork-safe")
    from ray._private.log import PlainRayHandler

    for handler in logging.getLogger("ray.data").handlers:
        if isinstance(handler, PlainRayHandler):  # the console one; the file handlers keep INFO
            handler.setLevel(logging.WARNING)
            if not any(isinstance(f, _NotOurWarnings) for f in handler.filters):
                handler.addFilter(_NotOurWarnings())


class _NotOurWarnings(logging.Filter):
    """Ray Data's console warnings that do not apply to how the stages size their pools: the
    "no available CPUs" warning fires whenever an actor pool holds every CPU of a small machine
    (the pools are sized from config, and a dataset that waits for them does run)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "does not have any available CPUs" not in record.getMessage()


def ensure_ray(cfg: RayConfig, *, log_to_driver: bool = False) -> None:
    """Join the configured cluster, or start a local Ray sized by config; idempotent.

    What tasks and actors print (Ray Train's controller and placement-group cleaner, C++
    warnings of the core workers, Lance's and transformers' notices, a service's access lines)
    stays in Ray's log files: every stage reports from the driver, and an error raised in a
    worker reaches the driver as the exception, whose remote traceback the stage's failure
    record keeps (`failures`, under ROOT/_logs/ beside the build, not in the head's session
    logs). Ray's own reports of a worker that died or was killed (out of memory) reach the
    driver whatever this flag says. `log_to_driver=True` forwards it all, for debugging."""
    if ray.is_initialized():
        return
    quiet_ray_console()
    runtime_env = {"env_vars": {k: os.environ[k] for k in QUIET_ENV}}
    quiet: dict[str, Any] = {"logging_level": logging.WARNING, "runtime_env": runtime_env}
    if cfg.address or os.environ.get("RAY_ADDRESS"):
        ray.init(
            address=cfg.address or os.environ["RAY_ADDRESS"], log_to_driver=log_to_driver, **quiet
        )
        return
    kwargs: dict[str, Any] = {"include_dashboard": False}
    if cfg.num_cpus:
        kwargs["num_cpus"] = cfg.num_cpus
    if cfg.object_store_memory_mb:
        kwargs["object_store_memory"] = cfg.object_store_memory_mb * 1024**2
    if cfg.temp_dir:
        kwargs["_temp_dir"] = os.path.abspath(cfg.temp_dir)
    # a local Ray listens on loopback only: its token-auth notice is for clusters
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(
        logging.ERROR
    )
    # the dry run has no GPU: declare none so no operator can wait forever for one
    ray.init(num_gpus=0, log_to_driver=log_to_driver, **quiet, **kwargs)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = True
    ctx.print_on_execution_start = False


# Ray Data lists a Parquet folder through a pool of footer-reading actors, 32 of them by default
# whatever the cluster, each a Python process started for that one read: on 2 CPUs a read of a
# few files started 32 processes (~1 s of CPU each). Two actors, each reading up to 128 footers
# at once, list the stages' folders (at most a few hundred files) as fast. The variable, when
# set, still decides.
PARQUET_FOOTER_ACTORS = ("RAY_DATA_PARQUET_FOOTER_NUM_ACTORS", "2")


def read_parquet_dataset(path: str, filesystem: Any = None) -> ray.data.Dataset:
    """`ray.data.read_parquet` of a folder with a small footer-reader pool (read where the
    dataset is made, so setting it here is enough)."""
    os.environ.setdefault(*PARQUET_FOOTER_ACTORS)
    return ray.data.read_parquet(path, filesystem=filesystem)


def on_this_node() -> Any:
    """A scheduling strategy for the driver's own node.

    For the small zero-CPU actors that coordinate a stage (the shared rate limiter, training's
    progress queue): Ray may place a zero-CPU actor on any node, and on a spot worker its loss
    would fail the stage it serves. The driver's node (the head, on a cluster) lives as long
    as the stage does."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)


def user_error_in(exc: BaseException) -> UserError | None:
    """The `UserError` a Ray task or actor raised, found through Ray's wrappers; None for a bug.

    Ray re-raises a remote exception as a `RayTaskError` subclass of the original's class (so it
    *is* a `UserError`, but its text is the worker traceback); its `.cause` is the original. Ray
    Data wraps UDF errors again, and keeps them findable only with `raise_original_map_exception`
    (set by `user_errors_from_ray`), since a wrapper's `__cause__` does not survive pickling.
    """
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, UserError) and not isinstance(e, RayTaskError):
            return e
        todo += [e.__context__, e.__cause__, getattr(e, "cause", None)]  # popped last first
    return None


# what Ray Data appends to an exception's message in the worker ("Failed to … after 1/1 attempts")
_RAY_SUFFIX = re.compile(r"\nFailed to .+ after \d+/\d+ attempts")
# kept off the console: the user sees one line, the file keeps the whole traceback
_traceback_log = log.getChild("tracebacks")
_traceback_log.propagate = False


# Ray Data echoes a failed task's exception to the console before raising it — its traceback and
# a plea to report a Ray bug (with raise_original_map_exception), or two lines of advice about
# max_errored_blocks. At a stage boundary the exception itself is the report: one line for a
# user's mistake, its traceback for a bug; so inside the block these echoes are dropped.
_RAY_DATA_ECHOES = (
    "ray.data.exceptions",
    "ray.data._internal.execution.streaming_executor_state",
)


class _NoTaskErrorEcho(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR


def user_message(error: UserError) -> str:
    """The error's own message, without what Ray Data appended to it."""
    return _RAY_SUFFIX.split(str(error), maxsplit=1)[0].rstrip()


def error_log_dir() -> str:
    """Where tracebacks of mapped errors go by default: this Ray session's log folder."""
    if ray.is_initialized():
        ctx = ray.get_runtime_context()
        return os.path.join(ctx.get_temp_dir(), ctx.get_session_name(), "logs")
    return tempfile.gettempdir()


def _log_traceback(exc: BaseException, log_dir: str) -> str:
    """Write `exc` with its whole (remote) traceback to a fresh file under `log_dir` (or the
    temp folder, when `log_dir` cannot be written: the user's error must not become ours)."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    name = f"cpr-error-{stamp}-{os.getpid()}.log"
    try:
        os.makedirs(log_dir, exist_ok=True)
        handler = logging.FileHandler(os.path.join(os.path.abspath(log_dir), name), "a", "utf-8")
    except OSError:
        handler = logging.FileHandler(os.path.join(tempfile.gettempdir(), name), "a", "utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    _traceback_log.addHandler(handler)
    try:
        _traceback_log.error("a user error raised inside Ray", exc_info=exc)
    finally:
        _traceback_log.removeHandler(handler)
        handler.close()
    return handler.baseFilename


# Who writes the Ray traceback of an error mapped by `user_errors_from_ray` and says where: the
# stage running now (`failures.recorded`: its record under ROOT/_logs/); None outside a stage
traceback_writer: ContextVar[Callable[[BaseException], str] | None] = ContextVar(
    "traceback_writer", default=None
)


@contextmanager
def user_errors_from_ray(log_dir: str | None = None) -> Iterator[None]:
    """At a stage boundary: a user's mistake raised inside Ray reaches them as its one line.

    A `UserError` raised in a Ray task or actor (a corrupt shard, a refusing endpoint) is
    re-raised here as itself, its message ending with where the full Ray traceback was written:
    `log_dir` when given, else the record of the stage that runs (`traceback_writer`), else the
    Ray session's log folder. An internal bug keeps its traceback.
    Datasets created inside the block raise UDF errors as themselves, so that their cause can
    be found (Ray Data's wrapper loses it on the way to the driver), and Ray Data's console echo
    of a failed task is held back (it stays in this exception); both are restored after.
    """
    ctx = ray.data.DataContext.get_current()
    previous = ctx.raise_original_map_exception
    ctx.raise_original_map_exception = True
    echo_filter = _NoTaskErrorEcho()
    for name in _RAY_DATA_ECHOES:
        logging.getLogger(name).addFilter(echo_filter)
    try:
        yield
    except Exception as exc:
        user = user_error_in(exc)
        if user is None or user is exc:  # a bug, or a UserError raised on the driver
            raise
        write = traceback_writer.get()
        if log_dir is None and write is not None:
            path = write(exc)
        else:
            path = _log_traceback(exc, log_dir or error_log_dir())
        user.args = (f"{user_message(user)} (Ray traceback in {path})",)
        raise user.with_traceback(None) from None
    finally:
        ctx.raise_original_map_exception = previous
        for name in _RAY_DATA_ECHOES:
            logging.getLogger(name).removeFilter(echo_filter)
