"""Object storage: the one client over local paths and S3, its settings, conditional
writes, retries, the folderless S3 filesystem, and the leases that fence writers."""
