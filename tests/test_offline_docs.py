"""--enable-offline-docs: /docs is Swagger UI from assets in the package. Headless Chromium
(Debian's `chromium`) loads it with every host but the loopback unreachable, and the
operations must be listed. Dev mode comes from VLLM_SERVER_DEV_MODE here, so the operator
routes are in the document too."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile

import httpx
import pytest
from server_helpers import ServerProcess

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess("--enable-offline-docs", env={"VLLM_SERVER_DEV_MODE": "1"}).wait_ready()
    yield proc.url
    proc.stop()


def test_docs_page_and_assets_are_served_locally(server):
    page = httpx.get(server + "/docs")
    assert page.status_code == 200 and "SwaggerUIBundle" in page.text
    # Every script and stylesheet the page names is this server's own.
    refs = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert refs and not [r for r in refs if "//" in r]
    for ref in refs:
        r = httpx.get(f"{server}/{ref}")
        assert r.status_code == 200 and len(r.content) > 100_000, ref
    css = httpx.get(server + "/static/swagger-ui/swagger-ui.css").text
    assert not re.findall(r"url\((?![\"']?data:)", css)  # only inline images
    assert httpx.get(server + "/static/swagger-ui/other.js").status_code == 404
    paths = httpx.get(server + "/openapi.json").json()["paths"]
    assert "/pause" in paths and not any(p.startswith("/static") for p in paths)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed "
                                              "(apt-get install -y chromium)")
def test_swagger_ui_lists_the_operations_with_the_network_off(server):
    with tempfile.TemporaryDirectory() as profile:
        dom = subprocess.run(
            [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu",
             "--disable-dev-shm-usage", f"--user-data-dir={profile}",
             # The network is off: no name resolves and every non-loopback connection
             # goes to a closed port (Chromium never proxies the loopback).
             "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
             "--proxy-server=http://127.0.0.1:9",
             "--virtual-time-budget=20000", "--dump-dom", server + "/docs"],
            capture_output=True, text=True, timeout=120, check=True).stdout
    listed = set(re.findall(r'data-path="([^"]+)"', dom))
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/models", "/pause",
                 "/update_weights", "/health"):
        assert path in listed, (path, sorted(listed))
