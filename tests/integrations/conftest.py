"""Fixtures of the integration tests: Ultralytics kept offline, the network refused loudly.

Ultralytics probes DNS, sends analytics and downloads fonts and assets when it thinks it is
online; ``YOLO_OFFLINE=1`` (set here before anything imports it) turns that off, and its settings
file goes to a temporary folder instead of the user's config dir. The autouse ``_no_network``
fixture makes any connection or name lookup other than the loopback raise at once, so a test
that reaches for the network fails with the address instead of hanging until a timeout.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import tempfile
from typing import Any

import pytest

os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_AUTOINSTALL", "0")
if "YOLO_CONFIG_DIR" not in os.environ:
    _config_dir = tempfile.mkdtemp(prefix="seg-datamodule-ultralytics-")
    os.environ["YOLO_CONFIG_DIR"] = _config_dir
    atexit.register(shutil.rmtree, _config_dir, True)

_LOOPBACK = {"127.0.0.1", "::1", "localhost", "0.0.0.0", ""}


def _is_loopback(address: Any) -> bool:
    if isinstance(address, (str, bytes)):  # AF_UNIX path
        return True
    host = address[0] if isinstance(address, tuple) and address else address
    return isinstance(host, str) and (host in _LOOPBACK or host.startswith("127."))


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    real_connect, real_connect_ex, real_getaddrinfo = socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo

    def connect(self: socket.socket, address: Any) -> Any:
        if not _is_loopback(address):
            raise RuntimeError(f"a test tried to reach the network: connect({address!r})")
        return real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> Any:
        if not _is_loopback(address):
            raise RuntimeError(f"a test tried to reach the network: connect_ex({address!r})")
        return real_connect_ex(self, address)

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if not _is_loopback((host,)):
            raise RuntimeError(f"a test tried to reach the network: getaddrinfo({host!r})")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)




@pytest.fixture(scope="session")
def demo_val_samples(demo_dir: Any) -> list[Any]:
    """Four validation samples of the demo data on a 128 px canvas; the last has no instance."""
    from seg_datamodule import COCOSegDataModule

    dm = COCOSegDataModule(image_size=128, batch_size=4, num_workers=0, demo_dir=str(demo_dir), use_cache=False)
    dm.setup("validate")
    samples = [dm.val_dataset[i] for i in (11, 12, 13, 15)]  # every 16th demo image is empty
    assert [s.num_instances for s in samples] == [4, 3, 2, 0]
    return samples
