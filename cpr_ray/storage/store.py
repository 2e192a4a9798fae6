"""The one way any stage reaches data: a URI resolved to a pyarrow filesystem and a path.

Local paths, ``file://`` and ``s3://`` take the same code path, so a test against an S3 endpoint on
loopback exercises exactly what runs against AWS. Credentials come from the standard AWS chain
(env, profile, instance role) and are never read, stored or logged here.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import os
import posixpath
import random
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from cpr_ray.errors import StorageError
from cpr_ray.storage.conditional_writes import (
    boto_client,
    boto_errors,
    condition_outcome,
    local_delete_if,
    local_write_if,
    md5,
)
from cpr_ray.storage.folderless_s3 import S3WithoutFolders
from cpr_ray.storage.s3_retries import broken_off, count_lance_retries, retried, sent_again
from cpr_ray.storage.settings import BucketSettings, StorageConfig

if TYPE_CHECKING:
    import lance

# `Storage.update_text`: lost races before giving up, and the first pause after one (doubling,
# jittered, at most a second): enough for dozens of runs appending to one file at once
# a hidden name (listings skip dot files), written and removed by `check_writable`
WRITE_CHECK = ".cpr-write-check"
UPDATE_TRIES = 30
UPDATE_BACKOFF_S = 0.05
_T = TypeVar("_T")


@dataclass(frozen=True)
class Location:
    fs: pafs.FileSystem
    path: str
    uri: str

    @property
    def is_s3(self) -> bool:
        return self.uri.startswith("s3://")

    def folderless_fs(self) -> pafs.FileSystem:
        """The filesystem to hand a library that creates folders before writing: on S3 one whose
        create_dir does nothing (`S3WithoutFolders`)."""
        return pafs.PyFileSystem(S3WithoutFolders(self.fs)) if self.is_s3 else self.fs


def join(uri: str, *parts: str) -> str:
    """Join URI parts with '/', on every backend."""
    out = uri.rstrip("/")
    for part in parts:
        out = f"{out}/{part.strip('/')}"
    return out


class Storage:
    def __init__(self, cfg: StorageConfig, *, call_s: float | None = None) -> None:
        self.cfg = cfg
        self._s3: dict[BucketSettings, pafs.S3FileSystem] = {}
        self._call_s = call_s  # set by `bounded`

    def bounded(self, call_s: float) -> Storage:
        """This store with each conditional write and tagged read (`write_if`, `read_tagged`,
        `delete_if`) given up within about `call_s` on S3: two attempts, each its connection
        and its answer within a quarter (half a second at least). What a lease's renewal uses:
        a store that hangs must fail a beat well before the lease would go stale."""
        return Storage(self.cfg.model_copy(update={"max_retries": 1}), call_s=call_s)

    @property
    def root(self) -> str:
        if self.cfg.root is None:
            raise StorageError("storage.root is not set: give the URI the build writes under")
        return self.resolve(self.cfg.root).uri

    def _s3_fs(self, bucket: str) -> pafs.S3FileSystem:
        """One client per distinct bucket settings: pyarrow takes region and anonymity per
        filesystem, so a public bucket in another region needs its own."""
        settings = self.cfg.for_bucket(bucket)
        if settings not in self._s3:
            kwargs: dict[str, Any] = {
                "force_virtual_addressing": self.cfg.s3_virtual_addressing,
                "anonymous": settings.s3_anonymous,
                # fail in seconds on a dead endpoint, not after minutes of retries
                "connect_timeout": 5,
                "request_timeout": 60,
                "retry_strategy": pafs.AwsStandardS3RetryStrategy(
                    max_attempts=self.cfg.max_retries + 1
                ),
            }
            if settings.s3_region:
                kwargs["region"] = settings.s3_region
            if self.cfg.s3_endpoint:
                parsed = urlparse(self.cfg.s3_endpoint)
                if not parsed.scheme or not parsed.netloc:
                    raise StorageError(
                        f"storage.s3_endpoint {self.cfg.s3_endpoint!r} must look like "
                        "http://host:port or https://host"
                    )
                kwargs["endpoint_override"] = parsed.netloc
                kwargs["scheme"] = parsed.scheme
            self._s3[settings] = pafs.S3FileSystem(**kwargs)
        return self._s3[settings]

    def resolve(self, uri: str) -> Location:
        if uri.startswith("s3://"):
            path = uri[len("s3://") :].rstrip("/")
            if not path:
                raise StorageError(f"{uri!r} names no bucket")
            return Location(self._s3_fs(path.split("/", 1)[0]), path, f"s3://{path}")
        if "://" in uri and not uri.startswith("file://"):
            scheme = uri.split("://", 1)[0]
            raise StorageError(
                f"unsupported storage scheme {scheme!r} in {uri!r}; use s3:// or a path"
            )
        local = os.path.abspath(uri[len("file://") :] if uri.startswith("file://") else uri)
        return Location(pafs.LocalFileSystem(), local, local)

    def lance_options(self, uri: str | None = None) -> dict[str, str]:
        """The same endpoint settings, in the form Lance's object store takes, for the bucket
        of `uri` (None: the defaults)."""
        count_lance_retries()  # before Lance's first request with them
        settings = (
            self.cfg.for_bucket(self.resolve(uri).path.split("/", 1)[0])
            if uri and uri.startswith("s3://")
            else self.cfg.for_bucket("")
        )
        opts: dict[str, str] = {"client_max_retries": str(self.cfg.max_retries)}
        if self.cfg.s3_endpoint:
            opts["aws_endpoint"] = self.cfg.s3_endpoint
            opts["allow_http"] = str(self.cfg.s3_endpoint.startswith("http://")).lower()
            opts["aws_virtual_hosted_style_request"] = str(self.cfg.s3_virtual_addressing).lower()
        region = (
            settings.s3_region
            or os.environ.get("AWS_REGION")
            or os.environ.get("AWS_DEFAULT_REGION")
        )
        if region:
            opts["aws_region"] = region
        if settings.s3_anonymous:
            opts["aws_skip_signature"] = "true"
        return opts

    def open_lance(self, uri: str, version: int | None = None) -> lance.LanceDataset:
        """A Lance table at `version` (None: its latest), with these endpoint settings."""
        import lance  # a heavy import: only the stages that read the corpus pay for it

        try:
            return self._again(
                lambda: lance.dataset(uri, version=version, storage_options=self.lance_options(uri))
            )
        except (OSError, ValueError) as exc:  # Lance's IO errors come as either
            if uri.startswith("s3://") and ACCESS_DENIED.search(str(exc)):
                raise StorageError(access_denied(uri)) from None
            raise

    def commit_lance(self, uri: str, commit: Callable[[], _T]) -> _T | lance.LanceDataset:
        """Make one commit to the Lance table at `uri` (a merge_insert, a delete, a restore, an
        overwrite, a refresh's bucket edits): `commit` opens the table and commits once; returns
        what it returned, or the table at its new version where the answer was lost.

        Lance's client retries what S3 throttled or failed, but passes up a listing broken off
        mid-body (a reset connection), which every commit makes to find the version it builds
        on: the commit is then made again, at most `storage.max_retries` times, for every
        caller. Safe because Lance publishes a version only by writing its manifest, and the
        root's lease makes this run the table's only writer: a version past the one before is
        this commit, landed with its answer lost, and is not made twice (a merge_insert applied
        twice would count its inserts as updates); none means nothing was committed (the
        attempt's data files stay unreferenced)."""
        before = self._lance_version(uri)
        for attempt in range(self.cfg.max_retries + 1):
            try:
                return commit()
            except (OSError, ValueError) as exc:  # Lance's IO errors come as either
                if attempt == self.cfg.max_retries or not broken_off(exc):
                    raise
            sent_again()
            if self._lance_version(uri) != before:
                return self.open_lance(uri)
            time.sleep(random.uniform(0, min(UPDATE_BACKOFF_S * 2**attempt, 2.0)))
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _lance_version(self, uri: str) -> int | None:
        """The latest version of the Lance table at `uri`; None: no table there yet."""
        try:
            return self.open_lance(uri).version
        except ValueError as exc:
            if "was not found" in str(exc):
                return None
            raise

    def make_dirs(self, uri: str) -> None:
        """A folder and its parents, locally. Nothing on S3, which has no folders: pyarrow's
        recursive create there writes a marker per level after a HeadBucket, which a role
        limited to some prefixes of the bucket (infra/iam-policy.json) is refused."""
        loc = self.resolve(uri)
        if loc.is_s3:
            return
        try:
            loc.fs.create_dir(loc.path, recursive=True)
        except OSError as exc:
            raise StorageError(_explain(loc, exc)) from None

    # -- checks and small files ------------------------------------------------------------
    def check(self, uri: str, *, must_exist: bool = False) -> Location:
        """Touch the location once, turning SDK errors into one message that says what to fix."""
        loc = self.resolve(uri)
        if must_exist and self._type_at(loc) == pafs.FileType.NotFound:
            raise StorageError(f"{loc.uri} does not exist")
        if not must_exist:
            self._type_at(loc)
        return loc

    def _type_at(self, loc: Location) -> pafs.FileType:
        """What is at a location: a file, a folder (S3: keys under `key/`) or nothing. On S3 a
        HEAD of a missing key answers 404 only to a caller AWS lets list the bucket, and whether
        a grant limited by `s3:prefix` counts is not documented: a 403 is settled by a listing
        with the key as prefix (`_listed`), which the shipped policy grants under the root."""
        try:
            return loc.fs.get_file_info(loc.path).type
        except OSError as exc:
            if loc.is_s3 and ACCESS_DENIED.search(str(exc)):
                found = self._listed(loc)
                if found != pafs.FileType.File:
                    return found
            raise StorageError(_explain(loc, exc)) from None

    def _listed(self, loc: Location) -> pafs.FileType:
        """What one ListObjectsV2 with the key as prefix shows at an S3 key that could not be
        read: the key itself (a file that these credentials may list but not read: the 403
        stands), keys under `key/` (a folder), or neither (missing, whatever a HEAD answered)."""
        bucket, key = _bucket_key(loc)
        try:
            pages = (
                self._boto()
                .get_paginator("list_objects_v2")
                .paginate(Bucket=bucket, Prefix=key, Delimiter="/")
            )
            for page in pages:
                if any(o["Key"] == key for o in page.get("Contents", [])):
                    return pafs.FileType.File
                if any(p["Prefix"] == f"{key}/" for p in page.get("CommonPrefixes", [])):
                    return pafs.FileType.Directory
        except boto_errors() as exc:
            raise StorageError(_explain_boto(loc, exc)) from None
        return pafs.FileType.NotFound

    def _missing(self, loc: Location, exc: Exception) -> bool:
        """Whether a refused or failed read of one S3 key means it is not there: a 404, or a 403
        where a listing finds no such key (see `_type_at`)."""
        if condition_outcome(exc) == "missing" or isinstance(exc, FileNotFoundError):
            return True
        response = getattr(exc, "response", None)
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") if response else None
        refused = status == 403 or ACCESS_DENIED.search(str(exc))
        return bool(loc.is_s3 and refused and self._listed(loc) == pafs.FileType.NotFound)

    def check_writable(self, uri: str) -> None:
        """Write and remove one small marker under the folder `uri` (on S3 a conditional PUT and
        a DELETE): the one check that tells a prefix these credentials may not write, in
        seconds, before any work. Reads cannot tell it: a role that may list the bucket learns
        that a key is missing whether or not it may read or write it (`_type_at`)."""
        marker = join(uri, WRITE_CHECK)
        self.write_if(marker, b"")  # None: another run's check is there, and was written too
        self.delete_file(marker)

    def check_prefix(self, uri: str) -> None:
        """List the folder `uri` once (on S3, one ListObjectsV2 of `key/`): what a role limited
        to some prefixes may do, where a HeadBucket needs the whole bucket. A missing folder is
        fine (nothing written yet); a missing bucket or a refusal is one message."""
        loc = self.resolve(uri)
        try:
            loc.fs.get_file_info(pafs.FileSelector(loc.path, allow_not_found=False))
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StorageError(_explain(loc, exc)) from None

    def exists(self, uri: str) -> bool:
        return self._type_at(self.resolve(uri)) != pafs.FileType.NotFound

    def written_at(self, uri: str) -> dt.datetime | None:
        """When the store last wrote the file (its clock: S3's LastModified, to the second), or
        None when there is none."""
        loc = self.resolve(uri)
        try:
            info = loc.fs.get_file_info(loc.path)
        except OSError as exc:
            raise StorageError(_explain(loc, exc)) from None
        if info.type == pafs.FileType.NotFound or info.mtime is None:
            return None
        mtime = info.mtime
        return mtime if mtime.tzinfo else mtime.replace(tzinfo=dt.timezone.utc)

    def _again(self, read: Callable[[], _T]) -> _T:
        """`read` once more when S3 broke off an answer mid-body (a reset connection), which
        pyarrow's, boto3's and Lance's clients pass up instead of retrying; at most
        `storage.max_retries` times. Only for reads: a write may have landed."""
        for attempt in range(self.cfg.max_retries + 1):
            try:
                return read()
            except Exception as exc:
                # botocore's errors imported only once a read failed
                retried: tuple[type[Exception], ...] = (OSError, ValueError, *boto_errors())
                last = attempt == self.cfg.max_retries
                if last or not isinstance(exc, retried) or not broken_off(exc):
                    raise
                sent_again()
                time.sleep(random.uniform(0, min(UPDATE_BACKOFF_S * 2**attempt, 2.0)))
        raise AssertionError("unreachable")

    def read_json(self, uri: str) -> Any:
        loc = self.resolve(uri)
        try:
            return json.loads(self._again(lambda: _read_all(loc)))
        except FileNotFoundError:
            raise
        except OSError as exc:
            if self._missing(loc, exc):
                raise FileNotFoundError(loc.uri) from None
            raise StorageError(_explain(loc, exc)) from None

    def write_json(self, uri: str, obj: Any) -> None:
        self.write_text(uri, json.dumps(obj, indent=2, sort_keys=True, default=str))

    def write_text(self, uri: str, text: str) -> None:
        """A small text file, written whole."""
        loc = self.resolve(uri)
        self.make_dirs(posixpath.dirname(loc.uri))
        try:
            with loc.fs.open_output_stream(loc.path) as f:
                f.write(text.encode())
        except OSError as exc:
            raise StorageError(_explain(loc, exc)) from None

    def is_file(self, uri: str) -> bool:
        return self.file_type(uri) == pafs.FileType.File

    def is_dir(self, uri: str) -> bool:
        return self.file_type(uri) == pafs.FileType.Directory

    def file_type(self, uri: str) -> pafs.FileType:
        """A file, a folder or nothing at `uri`, whether S3 answers a missing key with 404 or 403
        (`_type_at`): every existence check goes through here, never a filesystem's own."""
        return self._type_at(self.resolve(uri))

    def read_bytes(self, uri: str) -> bytes:
        """A whole file, gunzipped when its name ends in .gz."""
        loc = self.check(uri, must_exist=True)
        try:
            data = self._again(lambda: _read_all(loc))
        except OSError as exc:
            raise StorageError(_explain(loc, exc)) from None
        if not uri.endswith(".gz"):
            return data
        try:
            return gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise StorageError(f"{loc.uri} is not a complete gzip file ({exc})") from None

    def read_text(self, uri: str) -> str:
        return self.read_bytes(uri).decode("utf-8")

    def read_parquet(self, uri: str, columns: list[str] | None = None) -> pa.Table:
        """A Parquet file, or a folder of Parquet files read as one table."""
        loc = self.check(uri, must_exist=True)
        try:
            return self._again(lambda: pq.read_table(loc.path, filesystem=loc.fs, columns=columns))
        except (OSError, pa.ArrowInvalid) as exc:
            if loc.is_s3 and ACCESS_DENIED.search(str(exc)):
                raise StorageError(access_denied(loc.uri)) from None
            raise StorageError(f"cannot read Parquet at {loc.uri}: {exc}") from None

    def parquet_file(self, uri: str) -> pq.ParquetFile:
        """A Parquet file opened for reading its footer and row groups one at a time."""
        loc = self.check(uri, must_exist=True)
        try:
            return pq.ParquetFile(loc.fs.open_input_file(loc.path))
        except (OSError, pa.ArrowInvalid) as exc:
            if loc.is_s3 and ACCESS_DENIED.search(str(exc)):
                raise StorageError(access_denied(loc.uri)) from None
            raise StorageError(f"cannot read Parquet at {loc.uri}: {exc}") from None

    def write_parquet(self, table: pa.Table, uri: str) -> None:
        """Write one Parquet file atomically: readers see the whole file or none of it."""
        self.write_parquet_stream([table], uri, table.schema)

    def write_parquet_stream(self, tables: Iterable[pa.Table], uri: str, schema: pa.Schema) -> None:
        """Write `tables` as one Parquet file, a row group (or more) each, holding one of them
        at a time, atomically: readers see the whole file or none of it.

        An object store's upload becomes visible only when it completes; on a local disk the
        file is written under a `_`-prefixed name (which every dataset reader skips) and
        renamed, so a process killed mid-write never leaves a truncated file where a reader, or
        a resumed run, will look.
        """
        loc = self.resolve(uri)
        self.make_dirs(posixpath.dirname(loc.uri))
        try:
            folder, name = posixpath.split(loc.path)
            path = loc.path if loc.is_s3 else posixpath.join(folder, f"_tmp-{os.getpid()}-{name}")
            try:
                with pq.ParquetWriter(path, schema, filesystem=loc.fs) as writer:
                    for table in tables:
                        writer.write_table(table)
            except BaseException:  # closing the writer published what it had: take it back
                with suppress(OSError):
                    loc.fs.delete_file(path)
                raise
            if not loc.is_s3:
                loc.fs.move(path, loc.path)
        except OSError as exc:
            raise StorageError(_explain(loc, exc)) from None

    @contextmanager
    def atomic_output(self, uri: str) -> Iterator[BinaryIO]:
        """A stream whose bytes appear at `uri` only when the block ends without error: written
        under a `_`-prefixed name (which listings and dataset readers skip), then moved into
        place (a server-side copy on S3), so an interrupted download never looks finished."""
        loc = self.resolve(uri)
        folder, name = posixpath.split(loc.path)
        tmp = posixpath.join(folder, f"_tmp-{os.getpid()}-{name}")
        self.make_dirs(posixpath.dirname(loc.uri))
        try:
            stream = loc.fs.open_output_stream(tmp, compression=None)  # bytes as given
        except OSError as exc:
            raise StorageError(_explain(loc, exc)) from None
        try:
            yield stream
        except BaseException:
            stream.close()
            loc.fs.delete_file(tmp)
            raise
        try:
            stream.close()
            loc.fs.move(tmp, loc.path)
        except OSError as exc:
            raise StorageError(_explain(loc, exc)) from None

    def delete_dir(self, uri: str) -> None:
        loc = self.resolve(uri)
        if self._type_at(loc) == pafs.FileType.NotFound:
            return
        try:
            loc.fs.delete_dir(loc.path)
        except OSError as exc:
            raise StorageError(_explain(loc, exc)) from None

    def list_dirs(self, uri: str) -> list[str]:
        loc = self.resolve(uri)
        try:
            infos = loc.fs.get_file_info(pafs.FileSelector(loc.path, allow_not_found=True))
        except OSError as exc:
            raise StorageError(_explain(loc, exc)) from None
        return sorted(join(uri, i.base_name) for i in infos if i.type == pafs.FileType.Directory)

    def delete_file(self, uri: str) -> None:
        """Remove one file; gone already is fine."""
        loc = self.resolve(uri)
        try:
            loc.fs.delete_file(loc.path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StorageError(_explain(loc, exc)) from None

    def delete_files(self, uris: Sequence[str]) -> None:
        """Remove many files of one bucket (or disk); gone already is fine. On S3 a thousand
        per request (DeleteObjects), where one by one a compaction of 10^5 parts would take
        many minutes of round trips."""
        if not uris:
            return
        loc = self.resolve(uris[0])
        if not loc.is_s3:
            for uri in uris:
                self.delete_file(uri)
            return
        bucket = _bucket_key(loc)[0]
        keys = [_bucket_key(self.resolve(u))[1] for u in uris]
        try:
            for i in range(0, len(keys), 1000):
                objects = [{"Key": k} for k in keys[i : i + 1000]]
                done = self._boto().delete_objects(
                    Bucket=bucket, Delete={"Objects": objects, "Quiet": True}
                )
                if done.get("Errors"):
                    error = done["Errors"][0]
                    raise StorageError(
                        _explain(
                            self.resolve(f"s3://{bucket}/{error['Key']}"),
                            OSError(f"{error.get('Code')}: {error.get('Message')}"),
                        )
                    )
        except boto_errors() as exc:
            raise StorageError(_explain_boto(loc, exc)) from None

    def list_folder(self, uri: str) -> list[pafs.FileInfo]:
        """The files directly in a folder, `_`-prefixed ones included, sorted by name (on S3 one
        ListObjectsV2 of `key/`, a page per thousand); a missing folder holds none."""
        loc = self.resolve(uri)
        try:
            infos = loc.fs.get_file_info(pafs.FileSelector(loc.path, allow_not_found=True))
        except OSError as exc:
            raise StorageError(_explain(loc, exc)) from None
        return sorted((i for i in infos if i.type == pafs.FileType.File), key=lambda i: i.base_name)

    def list_files(
        self, uri: str, suffixes: tuple[str, ...] = (), *, missing_ok: bool = False
    ) -> list[pafs.FileInfo]:
        """Files under a prefix, recursively, sorted by path; hidden and `_`-prefixed skipped."""
        loc = self.resolve(uri)
        try:
            infos = loc.fs.get_file_info(pafs.FileSelector(loc.path, recursive=True))
        except FileNotFoundError:
            if missing_ok:
                return []
            raise StorageError(f"{loc.uri} does not exist") from None
        except OSError as exc:
            raise StorageError(_explain(loc, exc)) from None
        files = [
            i
            for i in infos
            if i.type == pafs.FileType.File
            and not any(part.startswith((".", "_")) for part in _rel_parts(loc.path, i.path))
            and (not suffixes or i.path.endswith(suffixes))
        ]
        return sorted(files, key=lambda i: i.path)

    # -- conditional writes: what makes a lease exclusive -----------------------------------
    # The store itself checks the condition, so of two writers racing for one name exactly one
    # wins. pyarrow's filesystems have no conditional write; on S3 these go through boto3 (same
    # endpoint, region and credentials chain), locally through a hard link and a file lock.

    def read_tagged(self, uri: str) -> tuple[bytes, str]:
        """A small file's bytes and the tag of this version of it (S3's ETag; locally the MD5,
        which is what S3 gives a single PUT), for `write_if` / `delete_if`."""
        loc = self.resolve(uri)
        if not loc.is_s3:
            try:
                with open(loc.path, "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                raise
            except OSError as exc:
                raise StorageError(_explain(loc, exc)) from None
            return data, md5(data)
        bucket, key = _bucket_key(loc)

        def get() -> tuple[bytes, str]:
            got = self._boto().get_object(Bucket=bucket, Key=key)
            return got["Body"].read(), got["ETag"].strip('"')

        try:
            return self._again(get)
        except boto_errors() as exc:
            if self._missing(loc, exc):
                raise FileNotFoundError(loc.uri) from None
            raise StorageError(_explain_boto(loc, exc)) from None

    def write_if(self, uri: str, data: bytes, *, tag: str | None = None) -> str | None:
        """Write `data` at `uri` only if nothing is there (`tag` None: S3 ``If-None-Match: *``,
        locally a hard link, which fails when the name exists), or only if the file is still
        the version `tag` names (S3 ``If-Match``; locally a compare-and-replace under an
        exclusive lock). Returns the new version's tag, or None when the condition failed:
        someone else wrote first."""
        loc = self.resolve(uri)
        if not loc.is_s3:
            try:
                return local_write_if(loc.path, data, tag)
            except OSError as exc:
                raise StorageError(_explain(loc, exc)) from None
        bucket, key = _bucket_key(loc)
        condition = {"IfNoneMatch": "*"} if tag is None else {"IfMatch": f'"{tag}"'}
        try:
            put = self._boto().put_object(Bucket=bucket, Key=key, Body=data, **condition)
            return put["ETag"].strip('"')
        except boto_errors() as exc:
            if condition_outcome(exc) in ("failed", "missing"):
                # a retry of a PUT that landed before its answer was lost finds its own write
                # there and fails the condition: the write is ours when the object holds `data`
                return self._landed(bucket, key, data) if retried(exc) else None
            raise StorageError(_explain_boto(loc, exc)) from None

    def delete_if(self, uri: str, tag: str) -> bool:
        """Remove the file only if it is still the version `tag` names; whether it did."""
        loc = self.resolve(uri)
        if not loc.is_s3:
            try:
                return local_delete_if(loc.path, tag)
            except OSError as exc:
                raise StorageError(_explain(loc, exc)) from None
        bucket, key = _bucket_key(loc)
        try:
            self._boto().delete_object(Bucket=bucket, Key=key, IfMatch=f'"{tag}"')
            return True
        except boto_errors() as exc:
            if condition_outcome(exc) == "missing" and retried(exc):
                return True  # a retried delete that had landed finds nothing left to delete
            if condition_outcome(exc) in ("failed", "missing"):
                return False
            raise StorageError(_explain_boto(loc, exc)) from None

    def update_text(
        self,
        uri: str,
        change: Callable[[str | None], str | None],
        *,
        tries: int = UPDATE_TRIES,
    ) -> str | None:
        """Read-modify-write of a small text file that several runs update at once (a model
        card that parallel evaluations append to). `change` gets the newest text (None: no file)
        and returns what to write: None to leave it as it is, the same text when there is
        nothing to add. The write is conditional on the version read; a writer that lost the
        race waits a moment (jittered, doubling) and applies `change` to the newer text, so
        `change` must be idempotent for what it adds. The text now stored, or None when `change`
        declined; a StorageError naming the file after `tries` lost races."""
        for attempt in range(tries):
            try:
                data, tag = self.read_tagged(uri)
                text: str | None = data.decode()
            except FileNotFoundError:
                text, tag = None, None
            new = change(text)
            if new is None or new == text:
                return new
            if self.write_if(uri, new.encode(), tag=tag) is not None:
                return new
            time.sleep(random.uniform(0, min(UPDATE_BACKOFF_S * 2**attempt, 1.0)))
        raise StorageError(
            f"{uri}: changed by other writers {tries} times while this run tried to update it; "
            "run it again"
        )

    def _landed(self, bucket: str, key: str, data: bytes) -> str | None:
        """The tag of the object at `key` if it holds `data` (S3's ETag of a single PUT is the
        MD5 of its bytes), else None: someone else's write."""
        try:
            head = self._again(lambda: self._boto().head_object(Bucket=bucket, Key=key))
        except boto_errors() as exc:
            if self._missing(self.resolve(f"s3://{bucket}/{key}"), exc):
                return None
            raise
        found = head["ETag"].strip('"')
        return found if found == md5(data) else None

    def _boto(self) -> Any:
        return boto_client(
            self.cfg.s3_endpoint,
            self.cfg.s3_region,
            self.cfg.s3_virtual_addressing,
            self.cfg.s3_anonymous,
            self.cfg.max_retries,
            None if self._call_s is None else max(0.5, self._call_s / 4),
        )


def _bucket_key(loc: Location) -> tuple[str, str]:
    bucket, _, key = loc.path.partition("/")
    return bucket, key


def _explain_boto(loc: Location, exc: Exception) -> str:
    return _explain(loc, OSError(str(exc)))


def _rel_parts(root: str, path: str) -> list[str]:
    return posixpath.relpath(path, root).split("/")


ACCESS_DENIED = re.compile(
    r"ACCESS_DENIED|AccessDenied|Access Denied|response code: 403|status 403|403 Forbidden"
)


def access_denied(uri: str) -> str:
    """The one line for S3's 403 on `uri`: which prefix of which bucket these credentials may not
    use, and the prefixes the shipped policy grants (infra/iam-policy.json)."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    where = f"prefix {key}" if key else "the top level"
    return (
        f"access denied to {uri}: these credentials may not use {where} of bucket {bucket} "
        "(infra/iam-policy.json lets jobs read s2/ and configs/ and write builds/, models/, "
        "eval/ and index/: put the path under one of those, or grant it)"
    )


def _explain(loc: Location, exc: OSError) -> str:
    text = str(exc)
    if not loc.is_s3:
        return f"cannot use {loc.uri}: {text}"
    if ACCESS_DENIED.search(text):
        return access_denied(loc.uri)
    if re.search(r"NoSuchBucket|specified bucket does not exist", text, re.I):
        bucket = loc.path.split("/")[0]
        return f"bucket {bucket!r} does not exist: {loc.uri} (check the bucket name)"
    hints = []
    low = text.lower()
    if "access" in low or "forbidden" in low or "credential" in low or "signature" in low:
        hints.append(
            "check the AWS credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or "
            "an instance role) and that they may use this bucket"
        )
    if "resolve" in low or "connect" in low or "timeout" in low or "curl" in low:
        hints.append("check storage.s3_endpoint / network reachability of the S3 endpoint")
    if "nosuchbucket" in low or "does not exist" in low or "bucket" in low and "not found" in low:
        hints.append("check the bucket name")
    hint = "; ".join(hints) or "check storage.s3_endpoint, the bucket name and the credentials"
    return f"cannot reach {loc.uri}: {text.splitlines()[0]} ({hint})"


def _read_all(loc: Location) -> bytes:
    with loc.fs.open_input_stream(loc.path) as f:
        return f.read()
