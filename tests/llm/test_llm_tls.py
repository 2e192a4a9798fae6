"""The judge endpoint over https, as the cluster profile's llm.base_url is: the client and the
probe verify the server's certificate; a private CA (an internal load balancer's) is trusted
through SSL_CERT_FILE, with no setting of ours; an untrusted certificate stops a stage before it
starts, in one line that says what to set. Plain http for local endpoints is every other LLM
test."""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from cpr_ray.config import LLMConfig
from cpr_ray.llm.client import LLMConfigError, probe_endpoint
from tests.standins.launch import free_port, standin

ROOT = Path(__file__).resolve().parents[2]


def _private_ca_certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 that is its own CA: (cert.pem, key.pem)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cpr-ray test private CA")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@pytest.fixture(scope="module")
def https_llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The scripted endpoint over https with a private CA's certificate: (base URL, CA file)."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = _private_ca_certificate(folder)
    port = free_port()
    script = [*standin("scripted_llm"), "--port", str(port)]
    with open(folder / "server.log", "wb") as log:
        proc = subprocess.Popen(
            [*script, "--tls-cert", str(cert), "--tls-key", str(key)],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
    url = f"https://127.0.0.1:{port}"
    trusting = ssl.create_default_context(cafile=str(cert))
    deadline = time.time() + 30
    while True:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=1, context=trusting)
            break
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                log_text = (folder / "server.log").read_text()
                pytest.fail(f"the https scripted LLM did not start: {log_text}")
            time.sleep(0.1)
    yield f"{url}/v1", cert
    proc.terminate()
    proc.wait(timeout=10)


def test_a_private_ca_is_trusted_through_ssl_cert_file(https_llm):
    """What a node does: SSL_CERT_FILE in the environment the client starts in (aiohttp makes
    its verifying context at import, so a fresh process, as a Ray worker is)."""
    base_url, ca = https_llm
    code = textwrap.dedent(
        f"""
        import asyncio
        from cpr_ray.config import LLMConfig
        from cpr_ray.llm.client import LLMClient, Usage, probe_endpoint
        from cpr_ray.queries.analogy import AnalogyJudgment

        cfg = LLMConfig(model="scripted", timeout_s=10, max_retries=0)
        probe_endpoint(cfg, {base_url!r})

        async def ask():
            client = LLMClient(cfg, base_url={base_url!r})
            try:
                prompt = "judge\\n<data>\\nQ title: diffusion models\\n</data>"
                return await client.ask("judge_analogy", prompt, AnalogyJudgment, usage=Usage())
            finally:
                await client.aclose()

        print(asyncio.run(ask()).status)
        """
    )
    env = {**os.environ, "SSL_CERT_FILE": str(ca)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["ok"]


def test_an_untrusted_certificate_stops_in_one_line_naming_the_fix(https_llm, monkeypatch):
    base_url, _ = https_llm
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    with pytest.raises(LLMConfigError) as stopped:
        probe_endpoint(LLMConfig(model="scripted", timeout_s=5), base_url)
    message = str(stopped.value)
    assert message.startswith(f"the TLS certificate of {base_url} is not trusted (")
    assert "self-signed certificate" in message and "set SSL_CERT_FILE" in message
    assert "\n" not in message
