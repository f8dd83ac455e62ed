"""Debian's nginx in front of real appliances, run with the shipped systemd/nginx-appliance.conf
(tests/ops/test_scaleout_live.py, tests/ops/test_postgres_live.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers.live import ROOT, Live, free_port, live_server, wait_listening

# Debian puts nginx in /usr/sbin, which is not on a normal user's PATH.
NGINX = shutil.which("nginx") or next((p for p in ["/usr/sbin/nginx"] if Path(p).exists()), None)
CONF = ROOT / "systemd" / "nginx-appliance.conf"


def nginx_conf(shipped: str, tmp: Path, port: int, backends: list[int]) -> str:
    """The shipped file, with this test's boxes and port in place of the example addresses,
    wrapped in the main context a conf.d file gets from Debian's nginx.conf."""
    servers = re.findall(r"^([ \t]*)server [\d.]+:\d+( [^;]*);\n", shipped, re.M)
    assert len(servers) >= 2, "the shipped upstream lists example boxes"
    indent, params = servers[0]
    ours = "".join(f"{indent}server 127.0.0.1:{p}{params};\n" for p in backends)
    text = re.sub(r"^[ \t]*server [\d.]+:\d+ [^;]*;\n", "", shipped, flags=re.M)
    text = text.replace("keepalive 16;", ours.lstrip() + f"{indent}keepalive 16;", 1)
    assert text.count("listen 80;") == 1
    text = text.replace("listen 80;", f"listen 127.0.0.1:{port};")
    temp = "".join(f"{k}_temp_path {tmp}/{k};\n" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return (f"error_log {tmp}/error.log info;\nevents {{ worker_connections 256; }}\n"
            f"http {{\naccess_log {tmp}/access.log;\n{temp}{text}\n}}\n")


@dataclass
class Nginx:
    proc: subprocess.Popen[bytes]
    port: int
    prefix: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def error_log(self) -> str:
        path = self.prefix / "error.log"
        return path.read_text(errors="replace") if path.exists() else ""


def start_nginx(tmp: Path, backends: list[int]) -> Nginx:
    port = free_port()
    conf = tmp / "nginx.conf"
    conf.write_text(nginx_conf(CONF.read_text(), tmp, port, backends))
    out = open(tmp / "nginx.out", "wb")
    cmd = [str(NGINX), "-p", str(tmp), "-e", str(tmp / "error.log"), "-c", str(conf),
           "-g", f"daemon off; pid {tmp}/nginx.pid;"]
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    out.close()
    ngx = Nginx(proc, port, tmp)

    def running() -> None:
        if proc.poll() is not None:
            raise RuntimeError(f"nginx exited: {(tmp / 'nginx.out').read_text()}\n{ngx.error_log()}")

    wait_listening(port, running, 10, "nginx")
    return ngx


# Two boxes of the bundled model as the scale-out tests run them: nginx connects from
# 127.0.0.1, so the boxes take the person's address from its X-Forwarded-For; one llama.cpp
# thread each, as two boxes of two threads on two cores would spin against each other.
BOX = {"slots": 2, "ctx_per_slot": 512, "kv_tokens": 2048, "threads": 1, "trusted_proxies": "127.0.0.1"}


@contextmanager
def two_boxes(model: Path, tmp: Path, **config: Any) -> Iterator[tuple[list[Live], Nginx]]:
    """Two started appliances (BOX and `config`) behind nginx; all stopped at the end (their exit
    codes unchecked: a test may kill one)."""
    for name in ("a", "b", "nginx"):
        (tmp / name).mkdir()
    with ExitStack() as stack:
        boxes = [stack.enter_context(live_server(tmp / name, model=model, ready=False, check_exit=False,
                                                 **{**BOX, **config})) for name in ("a", "b")]
        for box in boxes:  # both load at once
            box.wait_ready()
        ngx = start_nginx(tmp / "nginx", [b.port for b in boxes])
        try:
            yield boxes, ngx
        finally:
            ngx.proc.terminate()
            ngx.proc.wait(10)
