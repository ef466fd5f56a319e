"""The embedded Triton server: nvidia-pytriton's `tritonserver` binary run on our own model repository.

Recipe (each part checked by starting it; docs/operations.md, "Embedded services"): a backend
directory holding a copy of the bundled python backend with the stub of *our* Python version; LD_LIBRARY_PATH = the shared libpython's
directory + `nvidia_pytriton.libs`; the virtualenv's bin first on PATH (the stub imports numpy,
onnxruntime and tokenizers from it); every listener on 127.0.0.1.

`triton_endpoint(settings)` is what other commands use: it yields a gRPC url, starting a server only
when TRITON_URL is empty and none answers on the configured ports already.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from modpipe import log
from modpipe.services.process import ManagedProcess, ServiceError, port_open
from modpipe.serving import repository
from modpipe.settings import Settings
from modpipe.textmodel.artifacts import ModelBuild, resolve_model

_log = log.get(__name__)
HOST = "127.0.0.1"


def pytriton_root() -> Path:
    """nvidia-pytriton's `tritonserver/` tree. Found without importing the package: `import pytriton` loads
    its client, which needs gevent, zmq and more that serving never uses (the binary is all we run)."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise ServiceError("nvidia-pytriton is not installed; run `make setup`")
    root = Path(next(iter(spec.submodule_search_locations))).resolve() / "tritonserver"
    if not (root / "bin" / "tritonserver").exists():
        raise ServiceError(f"no tritonserver binary under {root}")
    return root


def _same_file(a: Path, b: Path) -> bool:
    return b.exists() and a.stat().st_size == b.stat().st_size and a.stat().st_mtime <= b.stat().st_mtime


def prepare_backends(dest: Path) -> Path:
    """`dest/python/`: the bundled python backend plus the stub built for this interpreter."""
    root = pytriton_root()
    pyver = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / pyver / "triton_python_backend_stub"
    if not stub.exists():
        raise ServiceError(f"nvidia-pytriton ships no python backend stub for Python {pyver}")
    backend = dest / "python"
    backend.mkdir(parents=True, exist_ok=True)
    files = [p for p in (root / "backends" / "python").iterdir() if p.is_file()] + [stub]
    for src in files:
        target = backend / src.name
        if not _same_file(src, target):
            tmp = target.with_suffix(target.suffix + f".tmp{os.getpid()}")
            shutil.copy2(src, tmp)
            os.replace(tmp, target)  # atomic: a server starting beside us never sees half a file
    return dest


def server_env(base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    ldlib = sysconfig.get_config_var("LDLIBRARY") or ""
    if not (Path(libdir) / ldlib).exists() or ".so" not in ldlib:
        _log.warning("no shared libpython found; the python backend stub may load the system's",
                     extra={"libdir": libdir, "ldlibrary": ldlib})
    site = Path(pytriton_root()).parents[1]  # .../site-packages
    libs = [libdir, str(site / "nvidia_pytriton.libs")]
    if env.get("LD_LIBRARY_PATH"):
        libs.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = os.pathsep.join(libs)
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([venv_bin, env.get("PATH", "")])
    return env


def _http_ok(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status == 200
    except OSError:
        return False


class TritonServer:
    """One tritonserver process serving a model build. Use as a context manager or start()/stop()."""

    def __init__(self, settings: Settings, build: ModelBuild | None = None, *, http_port: int | None = None,
                 grpc_port: int | None = None, metrics_port: int | None = None, variant: str | None = None,
                 log_verbose: int = 0, extra_args: list[str] | None = None, instance_kind: str = "auto"):
        self.settings = settings
        self.build = build or resolve_model(settings)
        self.http_port = http_port or settings.triton_http_port
        self.grpc_port = grpc_port or settings.triton_grpc_port
        self.metrics_port = metrics_port or settings.triton_metrics_port
        self.model_name = settings.triton_model
        self.variant = variant or settings.triton_variant
        if self.variant not in repository.EMBEDDED_VARIANTS:
            raise ServiceError(f"variant {self.variant!r} does not run in the embedded Triton (python backend only; "
                               f"it serves {', '.join(repository.EMBEDDED_VARIANTS)}): export it with "
                               f"`modpipe triton export --variant {self.variant}` for NVIDIA's Triton container")
        self.instance_kind = instance_kind  # cuda variant: auto = the GPU when there is one, else the CPU
        self.log_verbose = log_verbose
        self.extra_args = list(extra_args or [])
        self.root = settings.state_dir / "triton"
        self.log_path = self.root / "logs" / f"tritonserver-{self.grpc_port}.log"
        self.repo: Path | None = None
        self.process: ManagedProcess | None = None
        self.startup_s: float | None = None
        self._lock_file = None
        self._private_repo = False

    # -- endpoints
    @property
    def grpc_url(self) -> str:
        return f"{HOST}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://{HOST}:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{HOST}:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def models(self) -> list[str]:
        return [self.model_name, repository.TOKENIZER_MODEL, repository.POSTPROCESS_MODEL,
                repository.ENSEMBLE_MODEL]

    def ready(self) -> bool:
        if not _http_ok(f"{self.http_url}/v2/health/ready"):
            return False
        return all(_http_ok(f"{self.http_url}/v2/models/{m}/ready") for m in self.models())

    # -- lifecycle
    def _claim_repo(self) -> Path:
        """`state/triton/repo`, or a private `repo-<pid>` while another launcher serves from it."""
        self.root.mkdir(parents=True, exist_ok=True)
        lock = open(self.root / "repo.lock", "w")  # noqa: SIM115 - held for the server's lifetime
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self._lock_file = lock
            return self.root / "repo"
        except OSError:
            lock.close()
            self._private_repo = True
            return self.root / f"repo-{os.getpid()}-{self.grpc_port}"

    def load_errors(self, limit: int = 5) -> list[str]:
        """The log's model-load failures (what to show when start fails; CUDA noise left out)."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []
        hits = [ln for ln in lines if "failed to load" in ln or "Failed to initialize" in ln
                or (ln.startswith("E") and "Cuda" not in ln and "CUDA" not in ln)]
        return [ln if len(ln) <= 600 else ln[:600] + "..." for ln in hits[:limit]]

    def command(self) -> list[str]:
        assert self.repo is not None
        return [
            str(pytriton_root() / "bin" / "tritonserver"),
            f"--model-repository={self.repo}",
            f"--backend-directory={self.root / 'backends'}",
            f"--http-address={HOST}", f"--http-port={self.http_port}",
            f"--grpc-address={HOST}", f"--grpc-port={self.grpc_port}",
            f"--metrics-address={HOST}", f"--metrics-port={self.metrics_port}",
            "--allow-gpu-metrics=false", "--allow-cpu-metrics=true",
            "--strict-readiness=true", "--exit-on-error=true", "--exit-timeout-secs=5",
            f"--log-verbose={self.log_verbose}",
            *self.extra_args,
        ]

    def start(self, timeout: float = 120.0) -> TritonServer:
        t0 = time.monotonic()
        for port in (self.http_port, self.grpc_port, self.metrics_port):
            if port_open(HOST, port):
                raise ServiceError(f"port {port} on {HOST} is already in use: another Triton running? "
                                   "Set TRITON_URL to use it, or TRITON_*_PORT to other ports")
        self.repo = self._claim_repo()
        repository.assemble(self.repo, self.build, variant=self.variant, model_name=self.model_name,
                            instance_kind=self.instance_kind)
        prepare_backends(self.root / "backends")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.write_bytes(b"")  # one log per run: old lines would confuse `tail()`
        self.process = ManagedProcess("tritonserver", self.command(), self.log_path, env=server_env(),
                                      cwd=self.root)
        self.process.start()
        _log.info("triton starting", extra={"grpc": self.grpc_url, "http": self.http_url,
                                            "log": str(self.log_path), "repo": str(self.repo),
                                            "build": self.build.version})
        try:
            self.process.wait_ready(self.ready, timeout=timeout, interval=0.1)
        except ServiceError as exc:
            self.stop()
            errors = self.load_errors()
            raise ServiceError(f"tritonserver did not become ready (log: {self.log_path})"
                               + (":\n" + "\n".join(errors) if errors else f"\n{exc}")) from exc
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0
        _log.info("triton ready", extra={"grpc": self.grpc_url, "startup_s": round(self.startup_s, 2),
                                         "log": str(self.log_path)})
        return self

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the server alone first (it unloads models and ends its stubs), then the whole group."""
        proc = self.process
        if proc is not None and proc.proc is not None:
            if proc.alive():
                try:
                    proc.proc.send_signal(signal.SIGTERM)
                    proc.proc.wait(timeout)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    _log.warning("triton did not stop in time, killing its group", extra={"pid": proc.pid})
            proc.stop(timeout=2.0)  # SIGKILLs whatever is left in the process group
            _log.info("triton stopped", extra={"pid": proc.pid, "rc": proc.proc.returncode})
        self.process = None
        if self._private_repo and self.repo is not None:
            shutil.rmtree(self.repo, ignore_errors=True)
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    def info(self) -> dict:
        return {"grpc": self.grpc_url, "http": self.http_url, "metrics": self.metrics_url,
                "model": self.model_name, "variant": self.variant, "build_version": self.build.version,
                "build_path": str(self.build.path),
                "repository": str(self.repo), "log": str(self.log_path), "pid": self.pid,
                "startup_s": None if self.startup_s is None else round(self.startup_s, 2)}

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def running_server_url(settings: Settings) -> str | None:
    """The gRPC url of a Triton already serving our model on the configured local ports, if any."""
    http = f"http://{HOST}:{settings.triton_http_port}"
    if _http_ok(f"{http}/v2/health/ready", timeout=0.5) and \
            _http_ok(f"{http}/v2/models/{settings.triton_model}/ready", timeout=0.5):
        return f"{HOST}:{settings.triton_grpc_port}"
    return None


@contextlib.contextmanager
def triton_endpoint(settings: Settings, *, timeout: float = 120.0) -> Iterator[str]:
    """Yield a gRPC url serving `settings.triton_model`: TRITON_URL, a local server already running on the
    configured ports, or one started for the duration of the block (stopped on exit)."""
    if settings.triton_url:
        yield settings.triton_url
        return
    url = running_server_url(settings)
    if url:
        _log.info("using the running triton", extra={"grpc": url})
        yield url
        return
    server = TritonServer(settings).start(timeout=timeout)
    try:
        yield server.grpc_url
    finally:
        server.stop()


def describe(server: TritonServer) -> str:
    return json.dumps(server.info(), indent=2)
