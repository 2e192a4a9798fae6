"""Orchestration: the build (`build`), the nightly refresh (`refresh`) and the dry run
(`dry_run`). The only package that imports the stage packages together; the CLI and the jobs
parse, call one of these and print."""
