"""The client's own resources (sync): `client.snapshots`, `client.pools`, `client.volumes`."""

from __future__ import annotations

import time
from typing import Unpack

from orchard.env.errors import Unavailable
from orchard.env.models import pool as pm
from orchard.env.models import state as sm
from orchard.env.models import volume as vm
from orchard.env.sdk import calls
from orchard.env.sdk.calls import PoolOptions
from orchard.env.sdk.calls.pools import filled, unreachable
from orchard.env.sdk.core import Client


class Snapshots:
    """`client.snapshots`: the caller's snapshots (take one with `sb.snapshot()`)."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def list(self) -> list[sm.Snapshot]:
        """The caller's snapshots, oldest first (expired ones are gone).

        :return: the snapshots
        :raises NotSupported: a backend with no snapshots
        """
        return self._client._send(calls.list_snapshots())

    def get(self, snapshot_id: str) -> sm.Snapshot:
        """One snapshot.

        :param snapshot_id: its id
        :return: the snapshot
        :raises NotFound: the caller has none by that id
        """
        return self._client._send(calls.get_snapshot(snapshot_id))

    def delete(self, snapshot_id: str) -> None:
        """Delete a snapshot; its storage goes once no sandbox made from it runs.

        :param snapshot_id: its id
        :raises NotFound: the caller has none by that id
        """
        self._client._send(calls.delete_snapshot(snapshot_id))


class Pools:
    """`client.pools`: the caller's warm pools; claim from one with
    `client.sandboxes.create(pool=name)`."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def create(self, name: str, image: str, size: int, **opts: Unpack[PoolOptions]) -> pm.Pool:
        """Keep `size` sandboxes of `image` ready; the pool starts filling at once.

        :param name: unique among the caller's pools (lower case, digits, `.`, `_`, `-`)
        :param image: what its sandboxes run; claims must ask for this image (or none)
        :param size: how many to keep ready (0 to 1,000); they count against the quotas
        :param opts: `cpu`, `memory`, `disk`, `pids_limit` (every sandbox of the pool has
            these; a claim asking for others is refused with PoolMismatch), `network`
            (the egress they are born with; a claim may ask for another)
        :return: the pool (`ready` grows as it fills: see `wait_ready`)
        :raises InvalidRequest: a bad argument (ImageRefused: an image this key may not run)
        :raises Conflict: the caller has a pool by that name already
        :raises QuotaExceeded: its sandboxes would not fit the key's quota
        """
        return self._client._send(calls.create_pool(name, image, size, opts))

    def get(self, name: str) -> pm.Pool:
        """One pool: ready, creating and failed counts, the last refill error.

        :param name: its name
        :return: the pool
        :raises NotFound: the caller has no pool by that name
        """
        return self._client._send(calls.get_pool(name))

    def list(self) -> list[pm.Pool]:
        """The caller's pools, by name.

        :return: the pools
        :raises Unavailable: the service cannot be reached after the retries
        """
        return self._client._send(calls.list_pools())

    def delete(self, name: str) -> None:
        """Delete a pool and its unclaimed sandboxes (claimed ones are the claimers').

        :param name: its name
        :raises NotFound: the caller has no pool by that name
        """
        self._client._send(calls.delete_pool(name))

    def wait_ready(self, name: str, timeout_s: float = 120.0) -> pm.Pool:
        """Poll until the pool is full.

        :param name: its name
        :param timeout_s: how long to wait
        :return: the pool, full
        :raises Unavailable: not full after `timeout_s` (its message: the last refill error);
            a service that cannot be reached meanwhile (a replica restarting) is polled
            again until then
        :raises NotFound: the caller has no pool by that name
        """
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                pool: pm.Pool | None = self.get(name)
            except Unavailable as err:
                unreachable(err, deadline)
                pool = None
            if pool and filled(pool, name, deadline - time.monotonic()):
                return pool
            time.sleep(0.1)


class Volumes:
    """`client.volumes`: the caller's volumes (mount one with `sandboxes.create(volumes=)`)."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def create(
        self,
        name: str,
        *,
        timeout_s: float | None = None,
        labels: dict[str, str] | None = None,
    ) -> vm.Volume:
        """Create an empty volume.

        :param name: unique among the caller's volumes (letters, digits, `_.-`; 64 at most)
        :param timeout_s: time to live (removed once unmounted after it); None: kept
            until deleted
        :param labels: free-form labels kept with it
        :return: the volume
        :raises VolumeExists: the name is taken (409 `volume_exists`)
        :raises InvalidRequest: a bad name or lifetime
        :raises QuotaExceeded: the key holds as many volumes as it may
        """
        return self._client._send(calls.create_volume(name, timeout_s, labels))

    def list(self) -> list[vm.Volume]:
        """The caller's volumes, oldest first, each with its size and who mounts it now.

        :return: the volumes
        :raises Unavailable: the service cannot be reached after the retries
        """
        return self._client._send(calls.list_volumes())

    def get(self, name: str) -> vm.Volume:
        """One volume.

        :param name: its name
        :return: the volume
        :raises NotFound: the caller has none by that name
        """
        return self._client._send(calls.get_volume(name))

    def delete(self, name: str) -> None:
        """Delete a volume and its files.

        :param name: its name
        :raises VolumeInUse: a sandbox mounts it (409)
        :raises NotFound: the caller has none by that name
        """
        self._client._send(calls.delete_volume(name))
