"""Per-GPU memory of a training run, worked out before a GPU is rented (`cpr train --plan`).

Nothing here loads weights: the model's ``config.json`` (a folder, or the hub) builds the model on
the ``meta`` device, which gives every parameter's shape and no storage, so the parameter count
is exact. The bytes per GPU then follow what the trainer does (``trainer.train_worker``):

- **weights** in ``encoder.dtype`` (float32 by default: fp32 master weights), **gradients** in the
  same dtype, and fused AdamW's two moments, also in the parameters' dtype: 4 + 4 + 8 = 16 bytes
  a trained float32 parameter, the usual "16 bytes a parameter" of mixed-precision AdamW;
- **buffers** the strategy adds: DDP over more than one worker keeps a gradient-sized set of
  all-reduce buckets (``gradient_as_bucket_view`` is off, as Ray's ``prepare_model`` leaves it);
  FSDP (``sharding.shard``: ``fully_shard`` per block and on the root, bf16 parameters and fp32
  reduction on GPU) holds the root's gathered parameters (embeddings) for the whole step (FSDP2
  does not reshard the root after forward), two gathered blocks (the one computing and the one
  prefetched) and two blocks' unsharded gradients on their way to the fp32 reduce-scatter;
- **activations** of one forward: ``texts per forward × max_length`` tokens (every text padded to
  ``train.max_length``: the worst case), times the bytes a token keeps per layer. Those were
  counted with a saved-tensor census (``torch.autograd.graph.saved_tensors_hooks`` over one
  forward, per layer) for BERT (MiniLM) and Qwen3; see `layer_elements`. bf16 autocast over
  float32 weights adds the bf16 copy of every block's weights that backward keeps (2 bytes a
  parameter). With gradient checkpointing a layer keeps only its input, and backward recomputes
  one layer (and its weight copies) at a time.

The step's peak: with the gradient cache (a worker's texts exceed ``train.chunk_size``) every
chunk's backward runs with the gradients of the chunks before it already allocated, so the
peak is weights + optimizer + buffers + gradients + one chunk's activations. One plain forward
per step peaks at the start of its backward, before any gradient exists, and the gradients fill
as activations are freed: weights + optimizer + buffers + the larger of the two.

On CPU (the measured check in tests/train/test_train_plan.py) there is no autocast and every
activation is float32; attention with dropout runs PyTorch's math kernel there, which keeps the
attention matrices (GPUs use the fused memory-efficient kernel).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from cpr_ray.errors import ConfigError, InputError, UserError

if TYPE_CHECKING:
    from cpr_ray.config import Config, LoRAConfig, TrainConfig
    from cpr_ray.retrieval.spec import EncoderSpec

Device = Literal["cuda", "cpu"]
STRATEGIES = ("ddp", "fsdp")
GIB = 2**30
# A GPU sold as "80 GB" has 80 GiB, of which a process gets ~90% for tensors: the CUDA context,
# NCCL's buffers and the caching allocator's fragmentation take the rest.
USABLE_SHARE = 0.9
# Bytes an activation element takes on average under bf16 autocast: linear inputs and MLP
# intermediates are bf16, norm inputs and statistics and the residual stream stay float32. The
# saved-tensor census under (CPU) bf16 autocast gave 2.44 for BERT and 2.64 for Qwen3.
AUTOCAST_BYTES = 2.6
# Hard negatives per query when train.negatives is unset: the most a CPR export gives (three
# candidate groups × dataset.train_negatives_per_group's default 3).
DEFAULT_NEGATIVES = 9
GENERIC_FOLDER_NAMES = {"model"}  # our own OUT/model, and the MiniLM package's folder


@dataclass(frozen=True)
class Architecture:
    """What the plan needs of a transformer, read from its config and its meta-device model."""

    name: str
    parameters: int  # every parameter of the backbone
    frozen: int  # parameters the trainer never trains (BERT's unused pooler: freeze_unused)
    root_parameters: int  # outside the blocks: embeddings, final norm, pooler
    block_parameters: int  # one transformer block
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    decoder: bool  # pre-norm decoder (Llama, Qwen): else a post-norm encoder (BERT)
    gated_mlp: bool  # SwiGLU-style MLP (gate_proj, up_proj)
    qk_norm: bool  # norms on queries and keys (Qwen3)
    attention_dropout: float
    linears: tuple[tuple[str, int, int], ...]  # (name, in, out) of each linear, not the output


def model_name(model: str) -> str:
    """How the plan names a model: a hub repository's name, or a folder's.

    A folder with a generic name (``OUT/model``, the MiniLM package's ``…/model``) takes its
    model card's title when it has one, else ``PARENT/model``."""
    path = Path(model)
    if not path.is_dir():
        return model.rstrip("/").rsplit("/", 1)[-1]
    path = path.resolve()
    if path.name not in GENERIC_FOLDER_NAMES:
        return path.name
    card = path / "README.md"
    if card.is_file():
        for line in card.read_text(errors="replace").splitlines():
            if line.startswith("# "):
                return line[2:].strip()
    return f"{path.parent.name}/{path.name}"


def architecture(config: Any, name: str, spec: EncoderSpec) -> Architecture:
    """The model as `Encoder.build` loads the spec's model (AutoModel), built on the meta device
    from its transformers `config` (``model_source.model_config``): exact shapes, no memory."""
    import torch

    from cpr_ray.retrieval.model_source import meta_model

    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    try:
        hidden, layers = int(text.hidden_size), int(text.num_hidden_layers)
        heads = int(text.num_attention_heads)
    except AttributeError as exc:
        raise InputError(
            f"model {name}: its config has no {exc.name}: the plan knows transformer encoders "
            "and decoders (hidden_size, num_hidden_layers, num_attention_heads)"
        ) from None
    kv_heads = getattr(text, "num_key_value_heads", None)
    head_dim = getattr(text, "head_dim", None) or hidden // heads
    try:
        model = meta_model(spec, config, name)
    except (ValueError, KeyError, TypeError) as exc:
        if isinstance(exc, UserError):  # the setting that lets the model's own code run
            raise
        raise InputError(
            f"model {name}: transformers cannot build it from its config ({exc})"
        ) from None
    params = dict(model.named_parameters())  # tied weights once, as training holds them
    blocks = max(
        (m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == layers),
        key=lambda m: sum(p.numel() for p in m.parameters()),
        default=None,
    )
    if blocks is None:
        raise InputError(f"model {name}: no list of {layers} transformer blocks found in it")
    block = blocks[0]
    block_names = {n for n, _ in block.named_modules()}
    output = model.get_output_embeddings()  # a vocabulary head, where one is: never adapted
    linears = tuple(
        (n, m.in_features, m.out_features)
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and m is not output
    )
    total = sum(p.numel() for p in params.values())
    in_blocks = sum(p.numel() for p in blocks.parameters())
    return Architecture(
        name=name,
        parameters=total,
        frozen=sum(p.numel() for n, p in params.items() if ".pooler." in f".{n}"),
        root_parameters=total - in_blocks,
        block_parameters=sum(p.numel() for p in block.parameters()),
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=int(kv_heads or heads),
        head_dim=int(head_dim),
        intermediate=int(getattr(text, "intermediate_size", 4 * hidden)),
        decoder=kv_heads is not None,
        gated_mlp=any(n.endswith("gate_proj") for n in block_names),
        qk_norm=any(n.endswith("q_norm") for n in block_names),
        attention_dropout=float(
            getattr(text, "attention_probs_dropout_prob", None)
            or getattr(text, "attention_dropout", None)
            or 0.0
        ),
        linears=linears,
    )


def format_count(n: int) -> str:
    """1.23B, 22.7M, 512.0K."""
    if n >= 1e9:
        return f"{n / 1e9:.2f}B"
    if n >= 1e6:
        return f"{n / 1e6:.1f}M"
    if n >= 1e3:
        return f"{n / 1e3:.1f}K"
    return str(n)


def format_bytes(n: float) -> str:
    """GiB as a GPU's memory is sold ("80 GB" is 80 GiB); MB below one."""
    if n == 0:
        return "-"
    if n >= GIB:
        return f"{n / GIB:.1f} GB"
    return f"{n / 2**20:.0f} MB"


def _targets(arch: Architecture, lora: LoRAConfig) -> list[tuple[str, int, int]]:
    """The linear layers peft puts adapters on: all-linear, a regular expression the whole
    module name matches (a string), or names and name suffixes (a list); never the pooler."""
    wanted = lora.target_modules

    def targeted(name: str) -> bool:
        if wanted == "all-linear":
            return True
        if isinstance(wanted, str):
            return re.fullmatch(wanted, name) is not None
        return any(name == t or name.endswith("." + t) for t in wanted)

    return [lin for lin in arch.linears if ".pooler." not in f".{lin[0]}." and targeted(lin[0])]


def lora_parameters(arch: Architecture, lora: LoRAConfig) -> int:
    """Adapter parameters: r × (in + out) a targeted linear (A is r × in, B is out × r)."""
    return sum(lora.r * (fan_in + fan_out) for _, fan_in, fan_out in _targets(arch, lora))


def layer_elements(arch: Architecture, seq: int, math_attention: bool) -> float:
    """Activation elements one token keeps for backward in one block (the census, float32).

    Encoder (BERT): 10h + 2i + attention: the block's input, its two LayerNorm inputs and two
    dropout masks, the attention output and MLP input to their dense layers, q, k and v; the
    GELU's input and output. Decoder (Llama, Qwen3): 6h + 4i + 4·a·d + attention: per RMSNorm
    its input, its normalised value and its output (the projections' input); the SwiGLU's gate,
    activation, up and product; q and the attention output, k and v (repeated to all a heads:
    transformers expands GQA's kv heads when a padding mask is given); with q/k norms (Qwen3)
    their inputs and normalised values, 2·a·d + 2·kv·d more. Attention: the fused kernels keep a
    logsumexp per head and the padding mask's bias (a + s); PyTorch's CPU math kernel (with
    attention dropout) keeps the scores, the probabilities and their dropout (3·a·s).

    Every text is taken as padded (the mask is there), the worst case a real batch meets."""
    h, i, a, d = arch.hidden, arch.intermediate, arch.heads, arch.head_dim
    mlp = (4 if arch.gated_mlp else 2) * i
    attention = 3 * a * seq if math_attention else a + seq
    if not arch.decoder:
        return 10 * h + mlp + attention
    kv = arch.kv_heads
    repeated = a  # GQA's k and v are expanded to every head when a padding mask is given
    qk = 2 * a * d + 2 * kv * d if arch.qk_norm else 0
    return 6 * h + mlp + 2 * a * d + 2 * repeated * d + qk + attention


@dataclass(frozen=True)
class Footprint:
    """Bytes per GPU under one strategy."""

    strategy: str
    parameters: float
    gradients: float
    optimizer: float
    buffers: float  # DDP's gradient buckets; FSDP's gathered blocks and unsharded gradients
    activations: float  # one forward's, without gradient checkpointing
    activations_checkpointed: float
    gradient_cache: bool

    def peak(self, checkpointing: bool) -> float:
        acts = self.activations_checkpointed if checkpointing else self.activations
        base = self.parameters + self.optimizer + self.buffers
        if self.gradient_cache:  # every replayed chunk's backward meets the gradients so far
            return base + self.gradients + acts
        return base + max(self.gradients, acts)  # gradients fill as activations are freed


@dataclass(frozen=True)
class MemoryPlan:
    """A training configuration's memory per GPU under DDP and FSDP."""

    model: str
    parameters: int
    trained: int  # parameters with gradients and optimizer state (adapters only under LoRA)
    device: Device
    autocast: bool
    workers: int
    queries_per_worker: int
    negatives: int
    negatives_assumed: bool
    texts_per_worker: int
    texts_per_forward: int
    max_length: int  # tokens per text in training
    configured_length: int  # train.max_length (the model's own limit may be lower)
    gpu_bytes: float  # usable: train.gpu_memory_gb × USABLE_SHARE
    gpu_memory_gb: float
    strategy: str  # the configured one
    checkpointing: bool  # configured
    lora: bool
    ddp: Footprint
    fsdp: Footprint

    def footprint(self, strategy: str) -> Footprint:
        return self.ddp if strategy == "ddp" else self.fsdp

    def fits(self, strategy: str, checkpointing: bool) -> bool:
        return self.footprint(strategy).peak(checkpointing) <= self.gpu_bytes

    @property
    def configured_peak(self) -> float:
        return self.footprint(self.strategy).peak(self.checkpointing)

    @property
    def configured_fits(self) -> bool:
        return self.fits(self.strategy, self.checkpointing)


def _negatives(train: TrainConfig, found: int | None) -> tuple[int, bool]:
    """Hard negatives per query, and whether that is an assumption."""
    if train.in_batch_only:
        return 0, False
    if found is not None:
        return (found if train.negatives is None else min(found, train.negatives)), False
    if train.negatives is not None:
        return train.negatives, False
    return DEFAULT_NEGATIVES, True


def _activations(
    arch: Architecture,
    train: TrainConfig,
    tokens: int,
    length: int,
    *,
    device: Device,
    weight_bytes: int,
    autocast: bool,
    weight_copies: bool,
) -> tuple[float, float]:
    """Bytes one forward of `tokens` tokens keeps for backward: (without, with checkpointing).

    `weight_copies`: autocast casts float32 weights to bf16 in the forward, and backward keeps
    those copies with the block's graph (not under FSDP's bf16 MixedPrecisionPolicy, whose
    gathered parameters are bf16 already)."""
    act_bytes = AUTOCAST_BYTES if (autocast or weight_bytes == 2) else 4
    per_layer = layer_elements(arch, length, device == "cpu" and arch.attention_dropout > 0)
    lora = 0.0  # per token and block: peft's dropped-out adapter input and its mask
    if train.lora is not None and train.lora.dropout > 0:
        lora = sum(2 * fan_in for _, fan_in, _ in _targets(arch, train.lora)) / arch.layers
    # outside the blocks: the embeddings' sum, norm and dropout, or the final norm: ~3h a token
    outside = 3 * arch.hidden
    # backward's own working memory: one block's MLP gradients at a time (beyond what is kept)
    working = (4 if arch.gated_mlp else 2) * arch.intermediate
    copies = 2 * arch.block_parameters if weight_copies else 0
    block = (per_layer + lora) * act_bytes * tokens + copies
    rest = (outside + working) * act_bytes * tokens
    full = arch.layers * block + rest
    # checkpointing: each block keeps its input (the residual stream, in the weights' dtype);
    # backward recomputes one block at a time
    checkpointed = arch.layers * arch.hidden * weight_bytes * tokens + block + rest
    return full, checkpointed


def plan_memory(
    arch: Architecture,
    train: TrainConfig,
    *,
    weight_dtype: str = "float32",
    negatives: int | None = None,
    device: Device = "cuda",
    max_length: int | None = None,
) -> MemoryPlan:
    """The plan of `train` for `arch`: weights in `weight_dtype` (``encoder.dtype``), `negatives`
    hard negatives per query found in the data (None: train.negatives, else DEFAULT_NEGATIVES),
    on `device`, texts of `max_length` tokens (None: train.max_length; the model's own limit may
    cap it, as `Encoder.build` does: `token_limit`)."""
    workers = train.workers
    length = max_length or train.max_length
    k, assumed = _negatives(train, negatives)
    b = train.batch_size // workers
    docs = b * (1 + k)
    texts = b + docs
    cached = train.chunk_size is not None and texts > train.chunk_size
    # the cache chunks queries and documents apart: the largest forward is a documents' chunk
    per_forward = min(train.chunk_size, docs) if train.chunk_size and cached else texts

    wb = 2 if weight_dtype in ("float16", "bfloat16") else 4
    autocast = device == "cuda" and train.bf16
    tokens = per_forward * length
    shape: dict[str, Any] = {"device": device, "weight_bytes": wb, "autocast": autocast}
    full, checkpointed = _activations(
        arch, train, tokens, length, weight_copies=autocast and wb == 4, **shape
    )
    sharded = _activations(arch, train, tokens, length, weight_copies=False, **shape)
    if train.lora is None:
        trained, weights, grad_bytes = arch.parameters - arch.frozen, arch.parameters * wb, wb
    else:  # peft keeps adapters in float32 even over bf16 weights (autocast_adapter_dtype)
        trained = lora_parameters(arch, train.lora)
        weights, grad_bytes = arch.parameters * wb + trained * 4, 4
    gradients = trained * grad_bytes
    optimizer = 2 * trained * grad_bytes  # fused AdamW keeps both moments in the params' dtype
    ddp = Footprint(
        "ddp",
        parameters=weights,
        gradients=gradients,
        optimizer=optimizer,
        buffers=gradients if workers > 1 else 0,  # all-reduce buckets beside the gradients
        activations=full,
        activations_checkpointed=checkpointed,
        gradient_cache=cached,
    )
    # FSDP: everything sharded; the root's parameters (embeddings) stay gathered for the step,
    # two blocks are gathered at a time (computing, prefetched), in bf16 where autocast would
    # cast (MixedPrecisionPolicy), and two blocks' fp32 gradients wait for the reduce-scatter
    gathered = (arch.root_parameters + 2 * arch.block_parameters) * (2 if autocast else wb)
    block_trained = trained / arch.layers if train.lora else arch.block_parameters
    fsdp = Footprint(
        "fsdp",
        parameters=weights / workers,
        gradients=gradients / workers,
        optimizer=optimizer / workers,
        buffers=gathered + 2 * block_trained * 4,
        activations=sharded[0],
        activations_checkpointed=sharded[1],
        gradient_cache=cached,
    )
    return MemoryPlan(
        model=arch.name,
        parameters=arch.parameters,
        trained=trained,
        device=device,
        autocast=autocast,
        workers=workers,
        queries_per_worker=b,
        negatives=k,
        negatives_assumed=assumed,
        texts_per_worker=texts,
        texts_per_forward=per_forward,
        max_length=length,
        configured_length=train.max_length,
        gpu_bytes=train.gpu_memory_gb * GIB * USABLE_SHARE,
        gpu_memory_gb=train.gpu_memory_gb,
        strategy=train.strategy,
        checkpointing=train.gradient_checkpointing,
        lora=train.lora is not None,
        ddp=ddp,
        fsdp=fsdp,
    )


def plan_lines(plan: MemoryPlan) -> list[str]:
    """The plan as `cpr train --plan` prints it: the model line first, then a table per GPU."""
    lines = [f"{plan.model}: {format_count(plan.parameters)} parameters"]
    forward = (
        f"gradient cache, forwards of {plan.texts_per_forward} texts"
        if plan.texts_per_forward < plan.texts_per_worker
        else "one forward"
    )
    capped = (
        f" (the model's limit; train.max_length {plan.configured_length})"
        if plan.max_length < plan.configured_length
        else ""
    )
    lines.append(
        f"per GPU: {plan.queries_per_worker} queries × (1 positive + {plan.negatives} hard "
        f"negatives) = {plan.texts_per_worker:,} texts; {forward} × {plan.max_length} "
        f"tokens{capped}"
    )
    trained = (
        f"LoRA adapters ({format_count(plan.trained)} trained parameters)"
        if plan.lora
        else "full fine-tuning"
    )
    notes = [trained, "bf16 autocast" if plan.autocast else "float32 activations"]
    if plan.negatives_assumed:
        notes.append(f"train.negatives unset: {plan.negatives} assumed (a CPR export's most)")
    lines.append("; ".join(notes))
    d, f = plan.ddp, plan.fsdp
    rows = [
        ("parameters", d.parameters, f.parameters),
        ("gradients", d.gradients, f.gradients),
        ("optimizer state", d.optimizer, f.optimizer),
        ("buffers", d.buffers, f.buffers),
        ("activations", d.activations, f.activations),
        ("activations, checkpointing", d.activations_checkpointed, f.activations_checkpointed),
        ("peak", d.peak(False), f.peak(False)),
        ("peak, checkpointing", d.peak(True), f.peak(True)),
    ]
    width = max(len(r[0]) for r in rows)
    fsdp_head = f"FSDP over {plan.workers}"
    lines.append(f"{'':<{width}}  {'DDP':>10}  {fsdp_head:>13}")
    for label, ddp_bytes, fsdp_bytes in rows:
        lines.append(
            f"{label:<{width}}  {format_bytes(ddp_bytes):>10}  {format_bytes(fsdp_bytes):>13}"
        )
    fitting = [
        f"{s}{' with checkpointing' if c else ''}"
        for s in STRATEGIES
        for c in (False, True)
        if plan.fits(s, c) and not (c and plan.fits(s, False))
    ]
    lines.append(
        f"GPU: {plan.gpu_memory_gb:g} GB (train.gpu_memory_gb), {format_bytes(plan.gpu_bytes)} "
        f"usable; fits: {', '.join(fitting) if fitting else 'none'}"
    )
    configured = plan.strategy + (", checkpointing" if plan.checkpointing else "")
    verdict = "fits" if plan.configured_fits else f"does not fit: {advice(plan)}"
    lines.append(f"configured ({configured}): {format_bytes(plan.configured_peak)}, {verdict}")
    # every worker loads the whole model on the host before it moves to the GPU or is sharded,
    # and fsdp's rank 0 gathers it whole again beside a fresh copy for the final save: a node's
    # RAM, not only its GPU, bounds the model (8B in float32: 32 GB a worker)
    whole = d.parameters
    lines.append(
        f"host memory per worker: {format_bytes(whole)} (the whole model, as it loads)"
        + (
            f"; fsdp's rank 0 {format_bytes(2 * whole)} at the final save"
            if plan.strategy == "fsdp"
            else ""
        )
    )
    return lines


def _largest_chunk(plan: MemoryPlan) -> int | None:
    """The largest train.chunk_size (≥ 1 text) at which the configured setup fits, if any."""
    fp = plan.footprint(plan.strategy)
    acts = fp.activations_checkpointed if plan.checkpointing else fp.activations
    per_text = acts / plan.texts_per_forward
    cached = replace(fp, gradient_cache=True, activations=0.0, activations_checkpointed=0.0)
    room = plan.gpu_bytes - cached.peak(plan.checkpointing)
    chunk = math.floor(room / per_text) if per_text > 0 else 0
    return min(chunk, plan.texts_per_forward - 1) if chunk >= 1 else None


def advice(plan: MemoryPlan) -> str:
    """The one setting to change when the configured setup does not fit."""
    fits = plan.fits
    if not plan.checkpointing and fits(plan.strategy, True):
        return "set train.gradient_checkpointing=true"
    if plan.strategy == "ddp" and fits("fsdp", plan.checkpointing):
        return "set train.strategy=fsdp"
    if plan.strategy == "ddp" and fits("fsdp", True):
        return "set train.strategy=fsdp and train.gradient_checkpointing=true"
    chunk = _largest_chunk(plan)
    if chunk is not None:
        return f"set train.chunk_size={chunk} or smaller"
    if not plan.lora:
        return "train adapters (train.lora) or use more workers with train.strategy=fsdp"
    return "use more workers (train.workers) with train.strategy=fsdp, or GPUs with more memory"


def token_limit(spec: EncoderSpec) -> int | None:
    """The length a sentence-transformers model was trained at (its max_seq_length), which
    `Encoder.build` caps train.max_length at; None where the model names none."""
    from cpr_ray.retrieval.encoder import read_sentence_transformers_config

    try:
        return read_sentence_transformers_config(spec).max_seq_length
    except (OSError, ValueError):  # unreadable: plan for train.max_length, the larger
        return None


def spec_plan(
    spec: EncoderSpec,
    train: TrainConfig,
    *,
    negatives: int | None = None,
    device: Device = "cuda",
) -> MemoryPlan:
    """The plan of training the spec's model (its pooling, weights' dtype and loading
    settings) as `train` says."""
    from cpr_ray.retrieval.model_source import model_config

    arch = architecture(model_config(spec), model_name(spec.model), spec)
    limit = token_limit(spec)
    return plan_memory(
        arch,
        train,
        weight_dtype=spec.dtype,
        negatives=negatives,
        device=device,
        max_length=min(train.max_length, limit or train.max_length),
    )


def config_plan(
    cfg: Config, *, negatives: int | None = None, device: Device = "cuda"
) -> MemoryPlan:
    """The plan of a whole config: its encoder (encoder.model) trained as train says."""
    from cpr_ray.retrieval.spec import EncoderSpec

    cfg.require("encoder.model")
    spec = EncoderSpec.from_config(cfg.encoder)
    return spec_plan(spec, cfg.train, negatives=negatives, device=device)


def check_plan_fits(spec: EncoderSpec, train: TrainConfig, *, negatives: int | None = None) -> None:
    """Stop a GPU run whose plan does not fit its GPUs before Ray Train starts: a ConfigError of
    one line naming the setting to change. CPU runs are not checked against GPU memory.

    `negatives`: the most hard negatives a query has in the data read (None: train.negatives,
    else the plan's assumption)."""
    if not train.use_gpu:
        return
    plan = spec_plan(spec, train, negatives=negatives)
    if plan.configured_fits:
        return
    configured = f"train.strategy={plan.strategy}" + (
        ", gradient checkpointing" if plan.checkpointing else ""
    )
    raise ConfigError(
        f"{plan.model} needs ~{format_bytes(plan.configured_peak)} per GPU with {configured} "
        f"(train.gpu_memory_gb {plan.gpu_memory_gb:g}, {format_bytes(plan.gpu_bytes)} usable): "
        f"{advice(plan)} (cpr train --plan shows every option)"
    )
