"""The scale curve: every build stage and two nightly refreshes on synthetic corpora of doubling
size.

For each size (papers, `--citations-per-paper` citations each; `cpr_ray.sample.synthetic`) a
fresh process builds the stages one by one through the build's own entry point
(`cpr_ray.pipeline.build.run_build`, one stage a call) on a local Ray, then, twice from a copy of
that build, applies one S2 release step and runs `cpr refresh`
(`cpr_ray.pipeline.refresh.refresh`): `refresh`, a step that touches `--share` of the mined
pairs (its papers and their citations, as many changed papers outside any pair), and
`refresh-fixed`, the same kind of step touching `--diff-pairs` pairs at every size. The LLM is
the scripted endpoint at a fixed latency, the S2 Datasets API its stand-in (both the tests'
stand-ins, as `benchmarks/refresh.py` uses them); pooling runs BM25 and a dense pooler, a tiny
random BERT built from a config (it measures the plumbing, not the model). What grows with the
corpus grows with the size: base papers per field (`--papers-per-base`) and key buckets
(`--papers-per-bucket`, as a deployment sizes `ingest.num_buckets` to its corpus); everything
else is the config's.

Per stage and size: wall seconds; CPU seconds of the driver and every process under it but
the stand-ins (the cost, and a figure that other work on the same cores hardly moves); peak
resident memory (RSS, sampled every 0.2 s with psutil)
of the driver and of the largest Ray worker process during the stage; object-store bytes
spilled (the raylet's store stats); objects written under the build root (files created or
replaced); the phases the stage's manifest reports. A refresh also reports its parts, wall and
CPU seconds each: the corpus half (`apply-diffs`, and within it the OpenAlex relink, the
staging, the papers and citations edits and the commits) and every downstream stage it reruns.
Goals, per doubling: wall and CPU ≤ 2.2×, largest worker ≤ 1.25×, driver flat (≤ 1.1×); a
refresh's CPU ≤ 10% of the build's at every size, growing ≤ 2.2× per doubling at a share of
the pairs and ≤ 1.2× at a fixed number. Prints the table with ratios and verdicts, writes
`--out` (JSON) and `--plot` (log–log, the refreshes in red). Usage:

    python benchmarks/scale.py [--sizes 250000,500000,1000000] [--out scale.json] \
        [--plot benchmarks/scale.png] [--work DIR] [--llm-latency-ms 100] [--in-flight 32] \
        [--share 0.01] [--diff-pairs 80]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent
WALL_GOAL = 2.2  # per doubling of the corpus
WORKER_GOAL = 1.25
DRIVER_GOAL = 1.1  # "flat", with room for a shared machine's noise
REFRESH_SHARE = 0.10  # a refresh's CPU seconds against the build's, at every size
# a refresh's CPU growth per doubling of the corpus: at a fixed share of the pairs the diff
# doubles too; at a fixed number of pairs it does not, so the cost may hardly grow
REFRESH_GOALS = {"refresh": WALL_GOAL, "refresh-fixed": 1.2}
MB = 1024**2


# --- what the table says: pure arithmetic over the measured sizes ---------------------------


GOALS = {
    "seconds": WALL_GOAL,
    "cpu_seconds": WALL_GOAL,
    "worker_rss": WORKER_GOAL,
    "driver_rss": DRIVER_GOAL,
}
METRICS = ("seconds", "cpu_seconds", "worker_rss", "driver_rss", "spilled", "objects")


def ratios(values: Sequence[float]) -> list[float | None]:
    """Each value over the one before (the first has none); None where the one before is 0."""
    return [None] + [b / a if a else None for a, b in zip(values, values[1:])]


def _row(stage: str, measured: Sequence[dict[str, float]]) -> dict[str, Any]:
    """One stage's values over the sizes, each goal's ratios per doubling and whether it holds."""
    row: dict[str, Any] = {"stage": stage}
    for key in METRICS:
        row[key] = [m[key] for m in measured]
    for key, goal in GOALS.items():
        row[f"{key}_ratio"] = ratios(row[key])
        row[f"{key}_ok"] = all(r is None or r <= goal for r in row[f"{key}_ratio"])
    return row


def curve(sizes: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per stage over the measured `sizes` (ascending), in build order, then `build`
    (the stages together: seconds, spills and objects summed, the largest process's peak), then
    each refresh (`refresh`: the diff a share of the pairs; `refresh-fixed`: the same number of
    pairs at every size) with its share of the build's CPU seconds and its own goals
    (`REFRESH_GOALS`). `sizes[i]["stages"]` maps a stage to its {seconds, cpu_seconds,
    worker_rss, driver_rss, spilled, objects}."""
    names = list(sizes[0]["stages"])
    built = [n for n in names if n not in REFRESH_GOALS]
    rows = [_row(n, [s["stages"][n] for s in sizes]) for n in built]
    totals = [
        {k: (max if k.endswith("_rss") else sum)(s["stages"][n][k] for n in built) for k in METRICS}
        for s in sizes
    ]
    rows.append(_row("build", totals))
    for name, growth in REFRESH_GOALS.items():
        if name not in names:
            continue
        refresh = _row(name, [s["stages"][name] for s in sizes])
        refresh["share"] = [r / t["cpu_seconds"] for r, t in zip(refresh["cpu_seconds"], totals)]
        refresh["share_ok"] = all(s <= REFRESH_SHARE for s in refresh["share"])
        refresh["growth_goal"] = growth
        refresh["growth_ok"] = all(r is None or r <= growth for r in refresh["cpu_seconds_ratio"])
        rows.append(refresh)
    return rows


def verdict(row: dict[str, Any]) -> str:
    """`met`, or the goals a row misses with its worst ratio; for a refresh, its share of the
    build's CPU (goal ≤ `REFRESH_SHARE` at every size) and its CPU's growth per doubling."""
    if "share" in row:
        share = _cells([100 * s for s in row["share"]], ".1f")
        worst = max((r for r in row["cpu_seconds_ratio"] if r is not None), default=None)
        return (
            f"{share}% of the build's CPU (≤ {REFRESH_SHARE:.0%}: "
            f"{'met' if row['share_ok'] else 'missed'}); CPU "
            + ("–" if worst is None else f"≤ {worst:.2f}×")
            + f" per doubling (≤ {row['growth_goal']}×: "
            f"{'met' if row['growth_ok'] else 'missed'})"
        )
    missed = [
        f"{label} {max(r for r in row[f'{key}_ratio'] if r is not None):.2f}×"
        for label, key in (
            ("wall", "seconds"),
            ("cpu", "cpu_seconds"),
            ("worker", "worker_rss"),
            ("driver", "driver_rss"),
        )
        if not row[f"{key}_ok"]
    ]
    return "missed: " + ", ".join(missed) if missed else "met"


def _cells(values: Sequence[float | None], fmt: str) -> str:
    return " / ".join("–" if v is None else format(v, fmt) for v in values)


def markdown(rows: Sequence[dict[str, Any]], papers: Sequence[int]) -> str:
    """The table SCALE.md carries: each cell lists the sizes in order, ratios per doubling."""
    sizes = " / ".join(f"{p / 1000:g}k" for p in papers)
    head = (
        f"| stage | wall s ({sizes}) | × per doubling | CPU s | × | largest worker MB | × "
        "| driver MB | × | spilled MB | objects written | goals |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = [
        f"| {r['stage']} | {_cells(r['seconds'], '.1f')} "
        f"| {_cells(r['seconds_ratio'][1:], '.2f')} "
        f"| {_cells(r['cpu_seconds'], '.1f')} "
        f"| {_cells(r['cpu_seconds_ratio'][1:], '.2f')} "
        f"| {_cells([v / MB for v in r['worker_rss']], '.0f')} "
        f"| {_cells(r['worker_rss_ratio'][1:], '.2f')} "
        f"| {_cells([v / MB for v in r['driver_rss']], '.0f')} "
        f"| {_cells(r['driver_rss_ratio'][1:], '.2f')} "
        f"| {_cells([v / MB for v in r['spilled']], '.0f')} "
        f"| {_cells(r['objects'], 'd')} | {verdict(r)} |"
        for r in rows
    ]
    return head + "\n".join(lines) + "\n"


def parts_table(sizes: Sequence[dict[str, Any]]) -> str:
    """Where each refresh's CPU went, per size: one row a part (the corpus half's steps, then
    each downstream stage), CPU seconds over the sizes, and the build's same stage beside."""
    papers = " / ".join(f"{s['papers'] / 1000:g}k" for s in sizes)
    names = [n for n in REFRESH_GOALS if n in sizes[0]["stages"]]
    parts = list(dict.fromkeys(p for s in sizes for n in names for p in s["stages"][n]["parts"]))
    head = (
        f"| part | {' | '.join(f'{n} CPU s ({papers})' for n in names)} | build CPU s |\n"
        + "|---" * (len(names) + 2)
        + "|\n"
    )

    def cpu(stage: dict[str, Any] | None) -> float | None:
        return None if stage is None else stage["cpu_seconds"]

    lines = [
        f"| {part} | "
        + " | ".join(
            _cells([cpu(s["stages"][n]["parts"].get(part)) for s in sizes], ".1f") for n in names
        )
        + f" | {_cells([cpu(s['stages'].get(part)) for s in sizes], '.1f')} |"
        for part in parts
    ]
    return head + "\n".join(lines) + "\n"


def plot(rows: Sequence[dict[str, Any]], papers: Sequence[int], path: Path) -> None:
    """Wall seconds, CPU seconds and largest-worker memory against papers, log–log, one line a
    stage (the build black, the refreshes red: solid at a share of the pairs, dashed at a fixed
    number, dotted the refresh's goal of 10% of the build's CPU), with a line of slope 1 (cost
    proportional to the corpus) for reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (wall, cpu, mem) = plt.subplots(1, 3, figsize=(16, 4.2))
    colours = plt.get_cmap("tab20").colors
    for i, r in enumerate(rows):
        style = {"color": colours[i % len(colours)], "marker": "o", "label": r["stage"]}
        if r["stage"] == "build":
            style.update(color="black", linewidth=2.5)
        elif r["stage"] in REFRESH_GOALS:  # the nightly cost, against the build's black line
            style.update(color="red", linewidth=2.5, marker="s")
            style["linestyle"] = "--" if r["stage"] == "refresh-fixed" else "-"
        wall.plot(papers, r["seconds"], **style)
        cpu.plot(papers, r["cpu_seconds"], **style)
        if r["stage"] != "build":
            mem.plot(papers, [v / MB for v in r["worker_rss"]], **style)
    for ax, key in ((wall, "seconds"), (cpu, "cpu_seconds")):
        top = max(max(r[key]) for r in rows)
        ax.plot(papers, [top * p / papers[-1] for p in papers], "k:", label="∝ papers")
    build = next((r for r in rows if r["stage"] == "build"), None)
    if build is not None and any(r["stage"] in REFRESH_GOALS for r in rows):  # the refresh goal
        cpu.plot(
            papers,
            [REFRESH_SHARE * c for c in build["cpu_seconds"]],
            "r:",
            label=f"{REFRESH_SHARE:.0%} of the build",
        )
    for ax, title in (
        (wall, "wall seconds"),
        (cpu, "CPU seconds (driver and workers)"),
        (mem, "largest worker peak RSS, MB"),
    ):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("papers")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    labelled = dict(zip(*reversed(wall.get_legend_handles_labels())))
    labelled.update(zip(*reversed(cpu.get_legend_handles_labels())))
    fig.legend(list(labelled.values()), list(labelled), fontsize=7, loc="center right")
    fig.tight_layout(rect=(0, 0, 0.89, 1))
    fig.savefig(path, dpi=60)
    plt.close(fig)


# --- one size, measured in its own process -------------------------------------------------


class Probe:
    """Peak RSS of this process (the driver) and of its largest Ray worker, and the CPU seconds
    of the driver and every process under it, per stage window.

    A thread samples the driver and its descendant processes every `interval` seconds: the peak
    RSS among those whose title Ray set (``ray::…``: its workers and actors; not the raylet, the
    GCS or the stand-in servers), and every process's user + system CPU time. CPU seconds are
    the cost a cluster pays for a stage; unlike wall seconds they hardly move when other work
    shares the cores. Processes under `skip` (the stand-in LLM and S2 servers: an endpoint's
    cost, not the build's) are left out. `stage` resets the peaks, and adds the store's spilled
    bytes and the files created or replaced under `root` while it ran."""

    def __init__(self, root: Path, interval: float = 0.2) -> None:
        import psutil

        self.me = psutil.Process()
        self.root = root
        self.interval = interval
        self.driver = self.worker = 0
        self.skip: set[int] = set()
        self.cpu: dict[int, float] = {}  # the last CPU time seen per process, kept after it exits
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        import psutil

        driver, worker, cpu = self.me.memory_info().rss, 0, {}
        times = self.me.cpu_times()
        cpu[self.me.pid] = times.user + times.system
        skipped = set(self.skip)
        for proc in self.me.children(recursive=True):
            try:
                if proc.pid in skipped or proc.ppid() in skipped:
                    skipped.add(proc.pid)
                    continue
                times = proc.cpu_times()
                cpu[proc.pid] = times.user + times.system
                if proc.cmdline()[:1] and proc.cmdline()[0].startswith("ray::"):
                    worker = max(worker, proc.memory_info().rss)
            except psutil.Error:  # a process that exited between the listing and the read
                continue
        with self.lock:
            self.driver, self.worker = max(self.driver, driver), max(self.worker, worker)
            self.cpu.update(cpu)

    def _run(self) -> None:
        while not self.stopped.wait(self.interval):
            self._sample()

    @contextmanager
    def stage(self, name: str, into: dict[str, Any]) -> Iterator[None]:
        self._sample()
        with self.lock:
            self.driver = self.worker = 0
            cpu_before = dict(self.cpu)
        spilled = spilled_bytes()
        started = time.time()
        clock = time.perf_counter()
        yield
        seconds = time.perf_counter() - clock
        time.sleep(self.interval * 1.5)  # one more sample of the stage's end
        self._sample()
        with self.lock:
            driver, worker = self.driver, self.worker
            cpu = sum(t - cpu_before.get(pid, 0.0) for pid, t in self.cpu.items())
        into[name] = {
            "seconds": round(seconds, 2),
            "cpu_seconds": round(cpu, 2),
            "driver_rss": driver,
            "worker_rss": worker,
            "spilled": spilled_bytes() - spilled,
            "objects": files_since(self.root, started),
        }
        print(f"SCALE {name}: {json.dumps(into[name])}", file=sys.stderr, flush=True)

    def cpu_now(self) -> float:
        """The CPU seconds every measured process has used so far (a fresh sample)."""
        self._sample()
        with self.lock:
            return sum(self.cpu.values())

    @contextmanager
    def part(self, name: str, into: dict[str, Any]) -> Iterator[None]:
        """A window inside a stage (one of the refresh's steps): its wall and CPU seconds added
        to `into[name]`, the stage's peaks left alone."""
        cpu, clock = self.cpu_now(), time.perf_counter()
        try:
            yield
        finally:
            got = into.setdefault(name, {"seconds": 0.0, "cpu_seconds": 0.0})
            got["seconds"] = round(got["seconds"] + time.perf_counter() - clock, 2)
            got["cpu_seconds"] = round(got["cpu_seconds"] + self.cpu_now() - cpu, 2)

    def close(self) -> None:
        self.stopped.set()
        self.thread.join()


def spilled_bytes() -> int:
    """Bytes the local Ray's object store has spilled since it started (0 before Ray runs)."""
    import ray

    if not ray.is_initialized():
        return 0
    from ray._private.internal_api import get_memory_info_reply, get_state_from_address

    state = get_state_from_address(ray.get_runtime_context().gcs_address)
    return int(get_memory_info_reply(state).store_stats.spilled_bytes_total)


def files_since(root: Path, started: float) -> int:
    """Files under `root` created or replaced since `started` (epoch seconds)."""
    count = 0
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                count += os.stat(os.path.join(folder, name)).st_mtime >= started
            except FileNotFoundError:
                continue
    return count


def tiny_dense(folder: Path) -> str:
    """A random 1-layer, 32-wide BERT with MiniLM's tokenizer (mean pooling): the dense pooler's
    plumbing at the least encoding cost. Seeded, so every size encodes with the same weights."""
    from random_bert import save_random_bert  # this folder

    if not (folder / "config.json").is_file():
        save_random_bert(folder, hidden=32, heads=2, intermediate=64, max_positions=64)
    return str(folder)


def corpus(args: argparse.Namespace, papers: int) -> Path:
    """The raw synthetic corpus of `papers` papers under the work folder."""
    return args.work / f"raw-{papers}-{papers * args.citations_per_paper}"


def prepare(args: argparse.Namespace, papers: Sequence[int]) -> None:
    """The corpora and the tiny encoder, made before any size is measured, so that a measured
    driver's memory holds the build alone (not the generator's frames or an imported torch)."""
    from cpr_ray.sample.synthetic import generate

    for n in papers:
        if not (corpus(args, n) / "s2").is_dir():
            print(f"generating {n:,} papers", flush=True)
            generate(corpus(args, n), n, n * args.citations_per_paper, seed=7)
    tiny_dense(args.work / "dense-tiny")


@contextmanager
def _parts_measured(probe: Probe, parts: dict[str, Any]) -> Iterator[None]:
    """The refresh's corpus half (`apply_diffs`) and each downstream stage measured as a part
    of the refresh: each entry point wrapped for the duration, by name."""
    from cpr_ray.pipeline import build
    from cpr_ray.pipeline import refresh as refresh_mod

    def timed(name: str, fn: Any) -> Any:
        def run(*a: Any, **k: Any) -> Any:
            with probe.part(name, parts):
                return fn(*a, **k)

        return run

    from cpr_ray.corpus import apply_diffs as corpus_refresh

    steps = ("_openalex", "_stage", "_apply_papers", "_commit", "_rebucket")
    saved = {s: getattr(corpus_refresh, s) for s in steps}
    apply_citations = corpus_refresh.release_step.apply_citations
    stages, apply = dict(build.STAGES), refresh_mod.apply_diffs
    build.STAGES.update({n: timed(n, f) for n, f in stages.items()})
    refresh_mod.apply_diffs = timed("apply-diffs", apply)
    for s, fn in saved.items():
        setattr(corpus_refresh, s, timed(f"apply-diffs:{s.strip('_')}", fn))
    corpus_refresh.release_step.apply_citations = timed("apply-diffs:citations", apply_citations)
    try:
        yield
    finally:
        build.STAGES.update(stages)
        refresh_mod.apply_diffs = apply
        for s, fn in saved.items():
            setattr(corpus_refresh, s, fn)
        corpus_refresh.release_step.apply_citations = apply_citations


def measure(args: argparse.Namespace, papers: int) -> dict[str, Any]:
    """Build every stage, then refresh, on `papers` papers; each stage's measurements."""
    import shutil

    import pyarrow.parquet as pq

    sys.path.insert(0, str(BENCHMARKS))
    sys.path.insert(0, str(BENCHMARKS.parent))  # the repository: tests.*
    import refresh as refresh_bench

    from cpr_ray.pipeline.build import STAGES, run_build
    from cpr_ray.pipeline.refresh import refresh
    from cpr_ray.runs.ray_runtime import ensure_ray
    from cpr_ray.runs.stage_runner import require_manifest
    from cpr_ray.storage.store import Storage
    from tests.standins.clients import start_s2_standin, start_scripted_llm

    citations = papers * args.citations_per_paper
    raw = corpus(args, papers)
    root = args.work / f"build-{papers}"
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(args.work / f"s2-api-{papers}", ignore_errors=True)
    refresh_bench.clear_diff(raw)
    encoder = str(args.work / "dense-tiny")  # built by the parent: no torch in this driver
    dense = (
        f"{{name: dense, kind: dense, encoder: {{model: '{encoder}', max_length: 64, "
        "batch_size: 64, device: cpu, actors: 2, cpus_per_actor: 1, gpus_per_actor: 0}}"
    )
    extra = [
        f"pooling.poolers=[{dense}, {{name: bm25, kind: bm25, doc_template: '{{title}} "
        "{abstract}'}]",
        f"synthesis.embed_model={encoder}",
        f"ingest.num_buckets={max(4, papers // args.papers_per_bucket)}",
        f"ray.object_store_memory_mb={args.object_store_mb}",
        "ray.num_cpus=2",
    ]
    base_per_field = max(1, papers // args.papers_per_base)
    llm_proc, llm = start_scripted_llm(args.work / f"llm-{papers}.log")
    s2_proc, s2 = start_s2_standin(args.work / f"s2-api-{papers}", args.work / f"s2-{papers}.log")
    os.environ.setdefault("S2_API_KEY", s2.API_KEY)
    probe = Probe(root)
    probe.skip = {llm_proc.pid, s2_proc.pid}
    stages: dict[str, Any] = {}
    try:
        llm.latency(args.llm_latency_ms)
        llm.negatives(1)  # most pooled candidates are not usable, as with a real model
        cfg = refresh_bench.config(
            root, raw, llm.base_url, s2.api_url, args.in_flight, base_per_field, extra
        )
        ensure_ray(cfg.ray)  # Ray's own start is no stage's time (cold workers are, as in a build)
        for name in STAGES:
            with probe.stage(name, stages):
                manifest = run_build(cfg, [name])[name]
            # where a stage's time went, as it says (a refresh replaces these manifests)
            stages[name]["phases"] = manifest.get("stats", {}).get("phase_seconds")
        storage = Storage(cfg.storage)
        pairs = pq.read_table(require_manifest(storage, "mine")["tables"]["pairs"]["uri"])
        built = args.work / f"build-{papers}-built"
        shutil.rmtree(built, ignore_errors=True)
        shutil.copytree(root, built)  # each refresh starts from this build
        diffs = {"refresh": args.share, "refresh-fixed": args.diff_pairs / pairs.num_rows}
        for name, share in diffs.items():
            shutil.rmtree(root)
            shutil.copytree(built, root)
            plan = refresh_bench.release_diff(raw, s2.root, pairs, share)
            parts: dict[str, Any] = {}
            with probe.stage(name, stages), _parts_measured(probe, parts):
                refresh(cfg)
            stages[name]["parts"] = parts
            stages[name]["pairs_touched"] = len(
                plan.new_pairs | plan.changed_pairs | plan.retracted_pairs
            )
            print(f"SCALE {name} parts: {json.dumps(parts)}", file=sys.stderr, flush=True)
        shutil.rmtree(built)
    finally:
        probe.close()
        llm_proc.terminate()
        s2_proc.terminate()
    return {"papers": papers, "citations": citations, "pairs": pairs.num_rows, "stages": stages}


# --- the run over sizes --------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="250000,500000,1000000", help="papers, ascending")
    parser.add_argument("--citations-per-paper", type=int, default=10)
    parser.add_argument("--papers-per-base", type=int, default=2000, help="base papers per field")
    parser.add_argument("--papers-per-bucket", type=int, default=2500)
    parser.add_argument("--share", type=float, default=0.01, help="share of pairs the diff hits")
    parser.add_argument(
        "--diff-pairs",
        type=int,
        default=80,
        help="pairs the fixed-size diff hits at every size (its papers and their citations)",
    )
    parser.add_argument("--llm-latency-ms", type=float, default=100.0)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--object-store-mb", type=int, default=200)
    parser.add_argument("--work", type=Path, default=Path(".bench/scale"))
    parser.add_argument("--out", type=Path, default=None, help="JSON of every measurement")
    parser.add_argument("--plot", type=Path, default=BENCHMARKS / "scale.png")
    parser.add_argument("--one-size", type=int, help=argparse.SUPPRESS)  # the child's mode
    args = parser.parse_args(argv)
    args.work = args.work.resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.one_size:
        print("RESULT " + json.dumps(measure(args, args.one_size)), flush=True)
        return 0

    papers = [int(s) for s in args.sizes.split(",")]
    if papers != sorted(papers) or len(set(papers)) != len(papers):
        sys.exit("error: --sizes must be distinct and ascending, e.g. 250000,500000,1000000")
    prepare(args, papers)
    results = []
    for n in papers:  # each size in a fresh process: its own Ray, a driver that starts empty
        print(f"size {n:,} papers: building (log: {args.work / f'size-{n}.log'})", flush=True)
        child = [sys.executable, __file__, *(argv or sys.argv[1:]), "--one-size", str(n)]
        with open(args.work / f"size-{n}.log", "w") as log:
            done = subprocess.run(child, stdout=subprocess.PIPE, stderr=log, text=True)
        line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
        if done.returncode or line is None:
            print(done.stdout[-3000:])
            sys.exit(f"error: the {n:,}-paper size failed; see {args.work / f'size-{n}.log'}")
        results.append(json.loads(line[len("RESULT ") :]))
    rows = curve(results)
    table = markdown(rows, papers)
    print(table)
    print(parts_table(results))
    if args.out:
        args.out.write_text(json.dumps({"sizes": results, "curve": rows}, indent=1))
    plot(rows, papers, args.plot)
    print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
