"""Reading bulk-export shards as lines, naming the shard and the place where a broken one breaks.

Ray Data's `read_text` reads each file whole, splits it in a Python loop, and lets a truncated gzip
escape from deep inside a read task as an `OSError` that names no file (the user saw 310 lines of
worker traceback). Here one task streams one shard: gzip members are inflated a chunk at a time
with zlib, so when the stream breaks the compressed byte offset and the last complete line are
known, and the lines of each chunk are split by Arrow, not by a Python loop — at `\n` only
(`str.splitlines`, which `read_text` uses, also splits at U+2028 or U+0085, legal inside a JSON
string, and so turned one good record into two malformed ones).

What a broken shard does is the caller's choice (`ingest.on_corrupt_shard`): fail with an
`InputError` that names it, or give one `corrupt_shard` line in its place, which the parser turns
into a reject like any other bad line.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import BinaryIO, Literal

import pyarrow as pa
import pyarrow.compute as pc

from cpr_ray.errors import InputError, StorageError
from cpr_ray.storage.store import Storage

CHUNK_BYTES = 256 << 10  # compressed bytes read at a time: the resolution of a reported break
READ_BUFFER = 8 << 20  # bytes fetched per request underneath (one S3 GET, not one per chunk)
MAX_INFLATE = 16 << 20  # decompressed bytes per zlib call, so a dense member cannot blow memory
CORRUPT_SHARD = "corrupt_shard"
NOT_UTF8 = "not_utf8"
LINES = pa.schema([("text", pa.string()), ("path", pa.string()), ("reject", pa.string())])

OnCorrupt = Literal["fail", "quarantine"]


class BrokenShard(Exception):
    """The bytes of a shard stop making sense; `detail` says where. Internal: `ReadShards`
    turns it into an `InputError` or a quarantine line, so it never crosses a process."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


def _chunks(stream: BinaryIO) -> Iterator[bytes]:
    while chunk := stream.read(CHUNK_BYTES):
        yield chunk


def inflate(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Compressed chunks of a (multi-member) gzip file → decompressed pieces.

    Raises `BrokenShard` at damaged data or when the file ends inside a member (a truncated
    download), with the compressed byte offset.
    """
    member = zlib.decompressobj(wbits=31)
    fed = False  # whether the current member has seen any input
    offset = 0
    for chunk in chunks:
        start, offset = offset, offset + len(chunk)
        data = chunk
        while data:
            fed = True
            try:
                out = member.decompress(data, MAX_INFLATE)
            except zlib.error as exc:
                raise BrokenShard(
                    f"gzip data is damaged within compressed bytes {start:,}-{offset:,} ({exc})"
                ) from None
            if out:
                yield out
            if member.eof:  # the next member, if any, starts in what this one left over
                data = member.unused_data
                member, fed = zlib.decompressobj(wbits=31), False
            else:
                data = member.unconsumed_tail
    if fed and not member.eof:
        raise BrokenShard(f"gzip data ends early at byte {offset:,} (the file is truncated)")


def _line_table(data: bytes, uri: str) -> pa.Table:
    """Complete lines (no trailing newline) → a `LINES` table; bad UTF-8 lines are rejects."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        # rare: decode line by line so only the bad lines are set aside, with their reason
        pairs: list[tuple[str, str | None]] = []
        for raw in data.split(b"\n"):
            try:
                pairs.append((raw.decode("utf-8"), None))
            except UnicodeDecodeError:
                pairs.append((raw.decode("utf-8", errors="replace"), NOT_UTF8))
        texts = pa.array([t for t, _ in pairs], pa.string())
        rejects = pa.array([r for _, r in pairs], pa.string())
    else:
        texts = pc.split_pattern(pa.array([text], pa.large_string()), "\n").flatten()
        texts = texts.cast(pa.string())
        rejects = pa.nulls(len(texts), pa.string())
    texts = pc.utf8_rtrim(texts, characters="\r")
    return pa.Table.from_arrays(
        [texts, pa.repeat(pa.scalar(uri, pa.string()), len(texts)), rejects], schema=LINES
    )


def split_lines(pieces: Iterable[bytes], uri: str) -> Iterator[pa.Table]:
    """Decompressed pieces → tables of complete lines. On `BrokenShard`, the detail also says
    after which line the shard broke."""
    tail = b""
    lines = 0
    try:
        for piece in pieces:
            buf = tail + piece
            cut = buf.rfind(b"\n")
            if cut < 0:
                tail = buf
                continue
            table = _line_table(buf[:cut], uri)
            lines += table.num_rows
            tail = buf[cut + 1 :]
            yield table
    except BrokenShard as exc:
        raise BrokenShard(f"{exc.detail}, after line {lines:,}") from None
    if tail:
        yield _line_table(tail, uri)


def read_shard(storage: Storage, uri: str) -> Iterator[pa.Table]:
    """One shard's lines, in order, a chunk at a time; `.gz` shards are inflated on the way."""
    loc = storage.resolve(uri)
    try:
        with loc.fs.open_input_stream(
            loc.path, compression=None, buffer_size=READ_BUFFER
        ) as stream:
            chunks = _chunks(stream)
            yield from split_lines(inflate(chunks) if uri.endswith(".gz") else chunks, uri)
    except OSError as exc:
        raise StorageError(f"cannot read shard {uri}: {str(exc).splitlines()[0]}") from None


def quarantine_line(uri: str, detail: str) -> pa.Table:
    """The one line that stands for a quarantined shard: its reason and where it broke."""
    return pa.Table.from_pylist(
        [{"text": detail, "path": uri, "reject": CORRUPT_SHARD}], schema=LINES
    )


@dataclass(frozen=True)
class ReadShards:
    """Step: shard URIs (a `path` column, one per batch) → their lines (`LINES`).

    `quarantined` shards (URI → where they broke, from an earlier pass) are not read again:
    each gives its quarantine line only, so none of its lines reach the output.
    """

    storage: Storage
    on_corrupt: OnCorrupt = "fail"
    quarantined: Mapping[str, str] = field(default_factory=dict)

    def __call__(self, batch: pa.Table) -> Iterator[pa.Table]:
        for uri in batch["path"].to_pylist():
            if uri in self.quarantined:
                yield quarantine_line(uri, self.quarantined[uri])
                continue
            try:
                yield from read_shard(self.storage, uri)
            except BrokenShard as exc:
                if self.on_corrupt == "fail":
                    raise InputError(
                        f"shard {uri} is corrupt: {exc.detail}; replace it, or set "
                        "ingest.on_corrupt_shard=quarantine to build without it"
                    ) from None
                yield quarantine_line(uri, exc.detail)
