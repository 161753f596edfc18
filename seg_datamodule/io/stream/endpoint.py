"""The S3 client settings every stream read and upload uses: endpoint, bounded retries, plain ``http://``.

:func:`s3_storage_options` turns what a user gives (``stream_storage_options`` / ``storage_options``
and the ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` environment variables boto3 itself reads)
into the ``storage_options`` LitData hands to ``boto3.Session().client("s3", **options)``, with
two additions:

* a ``botocore`` :class:`~botocore.config.Config` of :data:`S3_ATTEMPTS` attempts (``"standard"``
  retries), a :data:`CONNECT_TIMEOUT_S` connect and :data:`READ_TIMEOUT_S` read timeout, unless
  the user gave ``config`` (a ``Config`` or a dict of its keyword arguments). LitData 0.2.76 builds
  its client with ``retries={"max_attempts": 1000, "mode": "adaptive"}`` and spreads the storage
  options after it (``litdata.streaming.client.S3Client._create_client``), so a ``config`` key
  replaces its budget: a dead endpoint fails in seconds instead of retrying 1,000 times.
* for a plain ``http://`` endpoint, :func:`allow_plain_http`: LitData 0.2.76 downloads chunks and
  uploads ``optimize`` output through ``obstore`` with the fixed client options
  ``litdata.streaming.downloader._OBSTORE_CLIENT_OPTIONS``, which lack ``allow_http``; obstore then
  refuses every ``http://`` URL ("builder error") and ``AWS_ALLOW_HTTP`` cannot help (explicit
  client options win). This is the one place the package edits that private dict.
* :func:`register_checked_downloader`: a chunk deleted from the bucket fails at once with
  :class:`MissingChunkError` instead of a 120 s wait (see :func:`_checked_s3_downloader`).

Nothing here is imported by ``import seg_datamodule``; LitData is imported only by
:func:`allow_plain_http`.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Mapping

from seg_datamodule.errors import UserInputError

__all__ = [
    "CONNECT_TIMEOUT_S", "LITDATA_PINNED", "READ_TIMEOUT_S", "S3_ATTEMPTS", "allow_plain_http", "bounded_client_config",
    "MissingChunkError", "endpoint_of", "register_checked_downloader", "s3_storage_options",
]

# The LitData release whose private names (``_OBSTORE_CLIENT_OPTIONS``) and client defaults this
# module was written against; pyproject pins it.
LITDATA_PINNED = "0.2.76"
# boto3 attempts per request (first try included). "standard" mode sleeps a random 0-1, 0-2,
# 0-4 s between them, so a refused connection fails within ~7 s and a blackholed one within
# 4 x CONNECT_TIMEOUT_S more; a restart of a second or two is still retried through.
S3_ATTEMPTS = 4
CONNECT_TIMEOUT_S = 3.0
READ_TIMEOUT_S = 30.0
_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")  # boto3's order of precedence


def bounded_client_config(config: Any = None) -> Any:
    """A ``botocore.config.Config`` with a bounded retry budget (see the module docstring).

    Args:
        config: ``None`` (the defaults here), a ``Config`` (returned as is) or a dict of
            ``Config`` keyword arguments (YAML), laid over the defaults.

    Raises:
        TypeError: ``config`` is none of these.
    """
    import botocore.config

    if isinstance(config, botocore.config.Config):
        return config
    if config is not None and not isinstance(config, Mapping):
        raise TypeError(f"storage option 'config' must be a botocore Config or a dict of its arguments, "
                        f"got {type(config).__name__}")
    defaults = {"retries": {"max_attempts": S3_ATTEMPTS, "mode": "standard"},
                "connect_timeout": CONNECT_TIMEOUT_S, "read_timeout": READ_TIMEOUT_S}
    return botocore.config.Config(**{**defaults, **dict(config or {})})


def endpoint_of(storage_options: Mapping[str, Any] | None = None) -> str | None:
    """The S3 endpoint a client built from ``storage_options`` talks to (``None``: AWS's own).

    ``endpoint_url`` in the options wins over ``AWS_ENDPOINT_URL_S3``, which wins over
    ``AWS_ENDPOINT_URL`` (boto3's order).
    """
    given = (storage_options or {}).get("endpoint_url")
    if given:
        return str(given)
    return next((os.environ[name] for name in _ENV if os.environ.get(name)), None)


def allow_plain_http() -> bool:
    """Let LitData's obstore client talk plain ``http://`` in this process (see the module docstring).

    Returns:
        bool: whether the option is set (``False``, with a warning, when this LitData no longer
        has ``_OBSTORE_CLIENT_OPTIONS``: then chunk reads from an ``http://`` endpoint may fail).
    """
    import litdata
    from litdata.streaming import downloader

    options = getattr(downloader, "_OBSTORE_CLIENT_OPTIONS", None)
    if not isinstance(options, dict):
        warnings.warn(f"litdata {litdata.__version__} has no litdata.streaming.downloader._OBSTORE_CLIENT_OPTIONS "
                      f"(written against {LITDATA_PINNED}): cannot enable plain http:// for its obstore client",
                      RuntimeWarning, stacklevel=2)
        return False
    options["allow_http"] = "true"
    return True


def s3_storage_options(source: str, storage_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``storage_options`` to hand LitData (and the pre-checks) for ``source``.

    For an ``s3://`` source: the user's options with the endpoint from the environment made
    explicit (so boto3 and obstore agree on it), ``config`` made a bounded
    :func:`bounded_client_config`, and :func:`allow_plain_http` applied for an ``http://``
    endpoint. Any other source: a copy of the options, unchanged.

    Args:
        source: a stream source or ``convert`` output (``s3://bucket/prefix``, a folder, ...).
        storage_options: boto3 client keyword arguments (``endpoint_url``,
            ``aws_access_key_id``, ``region_name``, ``config``, ...).

    Raises:
        TypeError: ``storage_options`` is not a mapping, or its ``config`` is not usable.
    """
    if storage_options is not None and not isinstance(storage_options, Mapping):
        raise TypeError(f"storage options must be a dict, got {type(storage_options).__name__}")
    options = dict(storage_options or {})
    if not str(source).startswith("s3://"):
        return options
    endpoint = endpoint_of(options)
    if endpoint and not options.get("endpoint_url"):
        options["endpoint_url"] = endpoint
    options["config"] = bounded_client_config(options.get("config"))
    register_checked_downloader()
    if endpoint and endpoint.lower().startswith("http://"):
        allow_plain_http()
    return options


class MissingChunkError(UserInputError, OSError):
    """A chunk named by ``index.json`` is not on the server (deleted under a running job)."""


def _status(err: BaseException) -> int | None:
    """The HTTP status of a botocore ``ClientError`` (``None`` for anything else)."""
    return (getattr(err, "response", None) or {}).get("ResponseMetadata", {}).get("HTTPStatusCode")


_PEER_DOWNLOAD_WAIT_S = 60.0  # the longest another worker's chunk download is waited for (4 x 3 s + 30 s budget)


def _checked_s3_downloader() -> type:
    """LitData's ``S3Downloader`` that fails on a missing object instead of waiting for it.

    LitData 0.2.76's ``S3Downloader.download_file`` runs under ``suppress(Timeout,
    FileNotFoundError)`` (obstore's not-found error is a ``FileNotFoundError``), so a chunk deleted
    from the bucket left the reader waiting ``MAX_WAIT_TIME`` (120 s) and then failing with a
    message that blames a hung download. Here, when the download returned without the file, the
    object is asked for (a HEAD): a 404 raises
    :class:`MissingChunkError` naming the URL and the endpoint, which LitData's prefetch thread
    hands to the reader at once.
    """
    from litdata.streaming.downloader import S3Downloader

    class CheckedS3Downloader(S3Downloader):
        def download_file(self, remote_filepath: str, local_filepath: str) -> None:
            try:  # boto3's path (a forked worker after obstore started) raises its 404 as a ClientError
                super().download_file(remote_filepath, local_filepath)
            except Exception as err:
                if _status(err) == 404:
                    raise self._missing(remote_filepath) from err
                raise
            if os.path.exists(local_filepath):
                return
            if self._wait_for_other_process(local_filepath):
                return
            # Not there: another process holds the lock (the object exists), or the GET was a 404.
            bucket, _, key = remote_filepath[len("s3://"):].partition("/")
            try:
                self._client.client.head_object(Bucket=bucket, Key=key)
            except Exception as err:
                if _status(err) == 404:
                    raise self._missing(remote_filepath) from err
                raise

        @staticmethod
        def _wait_for_other_process(local_filepath: str) -> bool:
            """Whether another process's download of the chunk, under way, published it.

            LitData takes the chunk's lock with timeout 0 and returns without the file when
            another worker holds it; that worker's readiness signal is in its own process, so
            this one polled the disk at 1 s steps. In the global order (issue 63) all workers of
            a node ask for the same chunk at once, so: wait (bounded) for the holder to finish.
            """
            from filelock import FileLock, Timeout

            try:
                with FileLock(local_filepath + ".lock", timeout=_PEER_DOWNLOAD_WAIT_S):
                    pass
            except Timeout:
                return False
            return os.path.exists(local_filepath)

        def _missing(self, remote_filepath: str) -> MissingChunkError:
            return MissingChunkError(
                f"{remote_filepath}: the chunk is not on {self._client.client.meta.endpoint_url} any more "
                "(deleted or overwritten under a running job?); its index.json still lists it")

    return CheckedS3Downloader


_REGISTERED: list[type] = []


def register_checked_downloader() -> None:
    """Make LitData use :func:`_checked_s3_downloader`'s class for ``s3://`` in this process (public
    ``litdata.streaming.downloader.register_downloader``; idempotent)."""
    from litdata.streaming.downloader import _DOWNLOADERS, register_downloader

    if _REGISTERED and _DOWNLOADERS.get("s3://") is _REGISTERED[0]:
        return
    if not _REGISTERED:
        _REGISTERED.append(_checked_s3_downloader())
    register_downloader("s3://", _REGISTERED[0], overwrite=True)
