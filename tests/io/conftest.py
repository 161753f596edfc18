"""Fixtures of the io tests: ``s3``, a real S3 API on the loopback (:class:`_s3_server.LoopbackS3`).

The endpoint is also in the environment (``AWS_ENDPOINT_URL``) for what takes no storage options
and for forked workers. LitData's obstore client options are restored afterwards (the package
turns ``allow_http`` on for an ``http://`` endpoint).
"""

from __future__ import annotations

from typing import Iterator

import pytest

from _s3_server import LoopbackS3


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[LoopbackS3]:
    """A :class:`LoopbackS3`, stopped afterwards; its endpoint and credentials in the environment."""
    pytest.importorskip("litdata")
    from litdata.streaming import downloader

    server = LoopbackS3()
    for key, value in (("AWS_ENDPOINT_URL", server.endpoint), ("AWS_ACCESS_KEY_ID", "testing"),
                       ("AWS_SECRET_ACCESS_KEY", "testing"), ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(key, value)
    saved = dict(downloader._OBSTORE_CLIENT_OPTIONS)
    try:
        yield server
    finally:
        server.stop()
        downloader._OBSTORE_CLIENT_OPTIONS.clear()
        downloader._OBSTORE_CLIENT_OPTIONS.update(saved)
