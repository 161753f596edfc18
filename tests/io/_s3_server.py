"""A real S3 API on the loopback for the streaming tests: moto's ``ThreadedMotoServer`` on 127.0.0.1.

:class:`LoopbackS3` starts it on a free port, emptied, with dummy credentials and a bucket ``bucket``, can
stop and restart it on the same port (moto keeps its buckets in this process, so the objects
survive a restart, as a real server's disks would). The ``s3`` fixture (``conftest.py`` here)
yields one; subprocesses reach it through ``AWS_ENDPOINT_URL``.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

__all__ = ["LoopbackS3", "demo_chunk_set"]


def demo_chunk_set(demo_dir: Path, out: Path, chunk_bytes: str) -> tuple[Path, dict[str, Any]]:
    """The demo train split converted to LitData chunks of ``chunk_bytes`` in ``out``: ``(out, its meta)``."""
    from seg_datamodule.io.stream import ChunkOptions, convert_coco

    meta = convert_coco(demo_dir / "annotations" / "instances_train2017.json", demo_dir / "train2017", str(out),
                        chunk_options=ChunkOptions(start_method="fork", chunk_bytes=chunk_bytes))
    return out, meta


class LoopbackS3:
    """A moto S3 server on ``127.0.0.1``; ``options`` are the boto3 client arguments that reach it."""

    def __init__(self) -> None:
        self._module = pytest.importorskip("moto.server", reason="needs moto[server]")
        import boto3

        self.server = self._module.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        self.host, self.port = self.server.get_host_and_port()
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request served, in order
        self._log_requests()
        self.endpoint = f"http://{self.host}:{self.port}"
        self.options: dict[str, Any] = {"endpoint_url": self.endpoint, "aws_access_key_id": "testing",
                                        "aws_secret_access_key": "testing", "region_name": "us-east-1"}
        # moto keeps its buckets in this process, across servers: start each LoopbackS3 empty, so a
        # test run twice in one session (--count, a rerun) or a prefix two tests share finds no
        # objects an earlier one left (LitData refuses to convert into a non-empty prefix).
        no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        no_proxy.open(urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")).close()
        self.client = boto3.client("s3", **self.options)
        self.client.create_bucket(Bucket="bucket")

    def _log_requests(self) -> None:
        """Record each request's method and path (the server's WSGI app, wrapped where it is served)."""
        server = self.server._server
        app = server.app

        def logged(environ: dict, start_response: Any) -> Any:
            self.requests.append((environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")))
            return app(environ, start_response)

        server.app = logged

    def delay_chunk_gets(self, seconds: float) -> list[int]:
        """Make every later GET of a ``.bin`` object sleep ``seconds`` first (a remote store's latency).

        Returns:
            A list that receives, for each such GET as it arrives, how many were in flight then (itself included).
        """
        server = self.server._server
        app, in_flight, lock, count = server.app, [], threading.Lock(), [0]

        def delayed(environ: dict, start_response: Any) -> Any:
            if environ["REQUEST_METHOD"] != "GET" or not environ.get("PATH_INFO", "").endswith(".bin"):
                return app(environ, start_response)
            with lock:
                count[0] += 1
                in_flight.append(count[0])
            try:
                time.sleep(seconds)
                return app(environ, start_response)
            finally:
                with lock:
                    count[0] -= 1

        server.app = delayed
        return in_flight

    def gets(self, prefix: str, suffix: str = ".bin") -> dict[str, int]:
        """GET requests per object under ``bucket/prefix`` whose name ends with ``suffix``."""
        counts: dict[str, int] = {}
        for method, path in self.requests:
            if method == "GET" and path.startswith(f"/bucket/{prefix}/") and path.endswith(suffix):
                counts[path] = counts.get(path, 0) + 1
        return counts

    def upload(self, folder: Path, prefix: str) -> str:
        """Upload every file of ``folder`` under ``bucket/prefix``; returns the ``s3://`` URL."""
        for file in sorted(folder.iterdir()):
            self.client.upload_file(str(file), "bucket", f"{prefix}/{file.name}")
        return f"s3://bucket/{prefix}"

    def keys(self, prefix: str) -> list[str]:
        listed = self.client.list_objects_v2(Bucket="bucket", Prefix=prefix + "/")
        return sorted(item["Key"] for item in listed.get("Contents", []))

    def stop(self) -> None:
        self.server.stop()

    def restart(self) -> None:
        """Start a new server on the same port (after :meth:`stop`)."""
        for _ in range(50):  # the port may linger for a moment after the old socket closed
            try:
                self.server = self._module.ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
                self.server.start()
                self._log_requests()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"could not restart the loopback S3 server on port {self.port}")
