"""pyarrow's S3 filesystem for a library that makes folders before it writes.

S3 has no folders; a library that creates them first (Ray Train's storage context) makes pyarrow
ask HeadBucket for a recursive create, which a role limited to prefixes of the bucket is refused
(infra/iam-policy.json grants no bucket-wide call). `Location.folderless_fs` hands such a library
this wrapper instead.
"""

from __future__ import annotations

from typing import Any

import pyarrow.fs as pafs


class S3WithoutFolders(pafs.FileSystemHandler):
    """An S3 filesystem whose create_dir does nothing, for a library that makes folders before
    it writes (Ray Train's storage context): S3 has no folders, and pyarrow's recursive create
    first asks HeadBucket, which a role limited to prefixes of the bucket is refused. Every other
    call goes to the real filesystem, whose streams are returned as they are."""

    def __init__(self, fs: pafs.FileSystem) -> None:
        self.fs = fs

    def __eq__(self, other: object) -> bool:
        return isinstance(other, S3WithoutFolders) and self.fs.equals(other.fs)

    def get_type_name(self) -> str:
        return "s3-without-folders"

    def normalize_path(self, path: str) -> str:
        return self.fs.normalize_path(path)

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return self.fs.get_file_info(paths)

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        return self.fs.get_file_info(selector)

    def create_dir(self, path: str, recursive: bool) -> None:
        pass

    def delete_dir(self, path: str) -> None:
        self.fs.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.fs.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        raise OSError("refusing to empty a whole bucket")

    def delete_file(self, path: str) -> None:
        self.fs.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        self.fs.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        self.fs.copy_file(src, dest)

    def open_input_stream(self, path: str) -> Any:
        return self.fs.open_input_stream(path)

    def open_input_file(self, path: str) -> Any:
        return self.fs.open_input_file(path)

    def open_output_stream(self, path: str, metadata: Any) -> Any:
        return self.fs.open_output_stream(path, metadata=metadata)

    def open_append_stream(self, path: str, metadata: Any) -> Any:
        return self.fs.open_append_stream(path, metadata=metadata)
