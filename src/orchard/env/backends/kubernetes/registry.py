"""A small client of the OCI distribution API (v2) for Orchard's in-cluster registry.

The Kubernetes backend keeps snapshots as images in that registry (the node helper pushes
them); deleting a snapshot deletes its manifest here, and the registry's gate
(deploy/kubernetes/images/registry/gate) then collects the blobs no manifest needs. Plain
httpx over plain HTTP: the registry is cluster-internal and reachable only by the service,
the node helper and the nodes (docs/kubernetes.md, "In-cluster registry").

`push_image` builds a one-platform OCI image from layer tarballs; the live tests use it,
and it is the shape the node helper's push has (blobs first, then the manifest, by tag).
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
# What a manifest GET/HEAD accepts: OCI and Docker's schema 2, single or multi-platform.
ACCEPT = ", ".join(
    (
        OCI_MANIFEST,
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    )
)


class RegistryError(Exception):
    """The registry answered something other than what the call expects."""

    def __init__(self, what: str, response: httpx.Response) -> None:
        super().__init__(f"{what}: HTTP {response.status_code} {response.text[:300]}")
        self.status_code = response.status_code


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Pushed:
    """An image pushed by `push_image`: its manifest digest and its blobs' digests."""

    repository: str
    tag: str
    digest: str
    config: str
    layers: tuple[str, ...]

    @property
    def blobs(self) -> tuple[str, ...]:
        return (self.config, *self.layers)


class RegistryClient:
    """Calls on one registry: blobs, manifests, deletes, and the gate's collection.

    :param base_url: where to dial it, e.g. ``http://10.96.0.50:5000``
    :param client: an httpx client to use (its own is made and closed otherwise)
    """

    def __init__(
        self, base_url: str, *, client: httpx.Client | None = None, timeout: float = 60
    ) -> None:
        self._own = client is None
        self._http = client or httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout)

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._own:
            self._http.close()

    def ping(self) -> bool:
        """Whether the registry answers its base route."""
        try:
            return self._http.get("/v2/").status_code == 200
        except httpx.HTTPError:
            return False

    # -- blobs ---------------------------------------------------------------------------
    def has_blob(self, repository: str, digest: str) -> bool:
        res = self._http.head(f"/v2/{repository}/blobs/{digest}")
        if res.status_code in (200, 404):
            return res.status_code == 200
        raise RegistryError(f"HEAD blob {digest}", res)

    def push_blob(self, repository: str, data: bytes) -> str:
        """Upload a blob in one request (POST then a monolithic PUT); a no-op if present.

        :return: its digest
        """
        digest = sha256_digest(data)
        if self.has_blob(repository, digest):
            return digest
        start = self._http.post(f"/v2/{repository}/blobs/uploads/")
        if start.status_code != 202:
            raise RegistryError("start an upload", start)
        location = start.headers["Location"]
        sep = "&" if "?" in location else "?"
        put = self._http.put(
            f"{location}{sep}digest={digest}",
            content=data,
            headers={"Content-Type": "application/octet-stream"},
        )
        if put.status_code != 201:
            raise RegistryError(f"finish the upload of {digest}", put)
        return digest

    # -- manifests -----------------------------------------------------------------------
    def put_manifest(self, repository: str, reference: str, body: bytes, media_type: str) -> str:
        """:return: the manifest's digest, as the registry computed it"""
        res = self._http.put(
            f"/v2/{repository}/manifests/{reference}",
            content=body,
            headers={"Content-Type": media_type},
        )
        if res.status_code != 201:
            raise RegistryError(f"PUT manifest {repository}:{reference}", res)
        return res.headers.get("Docker-Content-Digest") or sha256_digest(body)

    def manifest_digest(self, repository: str, reference: str) -> str | None:
        """The digest a tag (or digest) names now; None when there is no such manifest."""
        res = self._http.head(f"/v2/{repository}/manifests/{reference}", headers={"Accept": ACCEPT})
        if res.status_code == 404:
            return None
        if res.status_code != 200:
            raise RegistryError(f"HEAD manifest {repository}:{reference}", res)
        return res.headers["Docker-Content-Digest"]

    def delete_manifest(self, repository: str, reference: str) -> bool:
        """Delete a manifest (by tag: the digest it names now), and so every tag on it.

        :return: False when there was none (deleting twice is not an error)
        """
        digest = reference if ":" in reference else self.manifest_digest(repository, reference)
        if digest is None:
            return False
        res = self._http.delete(f"/v2/{repository}/manifests/{digest}")
        if res.status_code == 404:
            return False
        if res.status_code != 202:
            raise RegistryError(f"DELETE manifest {repository}@{digest}", res)
        return True

    def tags(self, repository: str) -> list[str]:
        res = self._http.get(f"/v2/{repository}/tags/list")
        if res.status_code == 404:
            return []
        if res.status_code != 200:
            raise RegistryError(f"tags of {repository}", res)
        return list(res.json().get("tags") or [])

    # -- the gate ------------------------------------------------------------------------
    def collect_garbage(self, timeout: float = 300) -> dict[str, Any]:
        """Run a collection now (POST /orchard/gc on the gate) and return what it did:
        ``blobs_removed``, ``bytes_removed``, ``seconds``, ``waited_s``, ``forced``."""
        res = self._http.post("/orchard/gc", timeout=timeout)
        if res.status_code != 200:
            raise RegistryError("garbage collection", res)
        return dict(res.json())

    # -- a whole image -------------------------------------------------------------------
    def push_image(
        self,
        repository: str,
        tag: str,
        layers: Sequence[bytes],
        *,
        entrypoint: Sequence[str] = (),
        env: Sequence[str] = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",),
        architecture: str = "amd64",
    ) -> Pushed:
        """Push a one-platform OCI image whose layers are the given (uncompressed) tarballs,
        gzipped here; blobs first, then the manifest under `tag`."""
        gzipped = [gzip.compress(layer, mtime=0) for layer in layers]
        config = json.dumps(
            {
                "architecture": architecture,
                "os": "linux",
                "config": {"Entrypoint": list(entrypoint) or None, "Env": list(env)},
                "rootfs": {"type": "layers", "diff_ids": [sha256_digest(x) for x in layers]},
            },
            separators=(",", ":"),
        ).encode()
        layer_digests = tuple(self.push_blob(repository, blob) for blob in gzipped)
        config_digest = self.push_blob(repository, config)
        manifest = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": OCI_MANIFEST,
                "config": {"mediaType": OCI_CONFIG, "digest": config_digest, "size": len(config)},
                "layers": [
                    {"mediaType": OCI_LAYER_GZIP, "digest": d, "size": len(b)}
                    for d, b in zip(layer_digests, gzipped, strict=True)
                ],
            },
            separators=(",", ":"),
        ).encode()
        digest = self.put_manifest(repository, tag, manifest, OCI_MANIFEST)
        return Pushed(repository, tag, digest, config_digest, layer_digests)
