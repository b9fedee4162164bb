"""E2B's host routing as a user of an SDK without the URL variables meets it: only
`E2B_DOMAIN` set, the SDK at `https://api.<domain>` and `https://<port>-<id>.<domain>`.

Everything is made per test module and removed after it, even on failure:
- a loopback address of its own (a random 127.x.y.z, so parallel runs do not meet),
  where `orchard serve` listens on 443 with TLS (`tls_cert`/`tls_key` of `serve()`) and
  dnsmasq on 53 answers every name under the domain with that address;
- a test CA and a wildcard certificate for `*.<domain>` made at run time;
- each SDK script runs in its own mount namespace (`unshare --mount`) with that
  resolver bind-mounted over /etc/resolv.conf, so the host's resolver is never touched,
  and trusts the CA through `SSL_CERT_FILE` (the SDK's transport, pyqwest, adds it to its
  roots; httpx reads it too).
Root only (ports under 1024, mount namespaces).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import random
import socket
import ssl
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.e2b.conftest import SDK
from tests.security.conftest import KEY_ALICE, Service

HTTPS_PORT = 443
SERVE_TLS = Path(__file__).with_name("_serve_tls.py")


def loopback_address() -> str:
    """A 127.x.y.z whose ports 53 (UDP) and 443 (TCP) are free now."""
    for _ in range(50):
        octets = random.randint(100, 254), random.randrange(255), random.randint(1, 254)
        address = "127." + ".".join(map(str, octets))
        try:
            for kind, port in ((socket.SOCK_DGRAM, 53), (socket.SOCK_STREAM, HTTPS_PORT)):
                with socket.socket(socket.AF_INET, kind) as s:
                    s.bind((address, port))
        except OSError:
            continue
        return address
    raise RuntimeError("no free loopback address for ports 53 and 443")


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_certificates(folder: Path, domain: str, address: str) -> tuple[Path, Path, Path]:
    """A test CA, and a certificate it signs for `*.<domain>`, `<domain>` and `address`:
    (ca.pem, cert.pem, key.pem), valid for an hour."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("orchard e2b test CA"))
        .issuer_name(_name("orchard e2b test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [
        x509.DNSName(f"*.{domain}"),
        x509.DNSName(domain),
        x509.IPAddress(ipaddress.ip_address(address)),
    ]
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(f"*.{domain}"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = folder / "ca.pem", folder / "cert.pem", folder / "key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    paths[2].chmod(0o600)
    return paths


def _query_a(address: str, name: str, timeout_s: float = 0.5) -> str | None:
    """The first A record the resolver at `address` answers for `name`, or None."""
    qname = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    packet = struct.pack(">HHHHHH", 0x4F52, 0x0100, 1, 0, 0, 0) + qname + b"\0\x01\0\x01"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout_s)
        try:
            s.sendto(packet, (address, 53))
            answer = s.recv(512)
        except OSError:
            return None
    count = struct.unpack(">H", answer[6:8])[0]
    if not count or len(answer) < 4:
        return None
    return socket.inet_ntoa(answer[-4:])  # the one answer, an A record, ends the packet


@contextmanager
def resolver(folder: Path, domain: str, address: str) -> Iterator[Path]:
    """dnsmasq on `address`:53 answering `*.<domain>` (and the domain) with `address`, no
    other name (no upstream); yields the resolv.conf that points at it."""
    log = folder / "dnsmasq.log"
    proc = subprocess.Popen(
        [
            "dnsmasq", "--keep-in-foreground", "--no-resolv", "--no-hosts",
            f"--listen-address={address}", "--bind-interfaces", "--port=53",
            f"--address=/{domain}/{address}", f"--local=/{domain}/",
            "--user=root", "--pid-file=", f"--log-facility={log}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while _query_a(address, f"api.{domain}") != address:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dnsmasq did not answer ({proc.poll()}): {_read(log)}")
            time.sleep(0.05)
        conf = folder / "resolv.conf"
        conf.write_text(f"nameserver {address}\noptions timeout:1 attempts:2\n")
        yield conf
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-2000:]
    except FileNotFoundError:
        return ""


@dataclass
class TLSService(Service):
    """The service on `address`:443 with TLS, under the E2B domain (`_serve_tls.py`)."""

    address: str = "127.0.0.1"
    ca: Path = Path()
    cert: Path = Path()
    key: Path = Path()
    port: int = HTTPS_PORT

    @property
    def url(self) -> str:
        return f"https://{self.address}:{self.port}"

    def client(self, key: str = KEY_ALICE, timeout: float = 60.0) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {key}"},
            timeout=timeout,
            verify=self.trust(),
        )

    def trust(self) -> ssl.SSLContext:
        """A TLS context that trusts the test CA (and nothing else)."""
        return ssl.create_default_context(cafile=self.ca)

    def start(self, timeout_s: float = 30.0) -> TLSService:
        log = self.log_path.open("ab")
        argv = [str(a) for a in (SERVE_TLS, self.address, self.port, self.cert, self.key)]
        self.proc = subprocess.Popen(
            [sys.executable, *argv], env=self.env(), stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"service exited ({self.proc.returncode}):\n{self.logs()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=2, verify=self.trust()).is_success:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"service did not answer within {timeout_s} s:\n{self.logs()}")
            time.sleep(0.05)


@dataclass
class HostSDK(SDK):
    """SDK scripts with only E2B_DOMAIN, E2B_API_KEY and the CA set, resolving names
    through the test's resolver (their own mount namespace)."""

    domain: str = ""
    ca: Path = Path()
    resolv_conf: Path = Path()
    extra_env: dict[str, str] = field(default_factory=dict)

    def env(self, key: str) -> dict[str, str]:
        drop = ("E2B_", "ORCHARD_", "SSL_CERT_", "REQUESTS_CA_BUNDLE", "HTTP_PROXY", "HTTPS_PROXY")
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith(drop)}
        env.update(
            E2B_DOMAIN=self.domain,
            E2B_API_KEY=key,
            SSL_CERT_FILE=str(self.ca),
            PYTHONUNBUFFERED="1",
            **self.extra_env,
        )
        return env

    def argv(self, script: str) -> list[str]:
        bind = 'mount --bind "$0" /etc/resolv.conf && exec "$@"'
        return [
            "unshare", "--mount", "--propagation", "private", "--",
            "sh", "-c", bind, str(self.resolv_conf), *super().argv(script),
        ]  # fmt: skip
