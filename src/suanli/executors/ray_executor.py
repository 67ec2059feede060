"""Runs a workload's node-ranks on the Ray nodes suanli's scheduler chose: Ray carries out the placement, never makes it.

One attempt is one detached placement group with a bundle per node-rank, each pinned by label selector to the
Ray node id in `NodeRank.host` and reserving that rank's GPUs (a count: Ray then lends them to nobody else), and
one detached named actor per rank in its bundle (`ray_actor.RankRunner`) that runs the rank through the same
launcher as the local executor, on the node's disk. The handle names the placement group and the actors, so any
server process (one started after a `kill -9`) finds them again by name. State the gang needs across servers
(the stop request, the first failure, the final status) is kept in the server's log_dir, as the local executor
keeps it; each rank's log is copied there, chunk by chunk, on every poll.

`import ray` happens on first use only (here and in `ray_connect`): the server starts without Ray installed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from suanli.executors.base import EngineNode, Launch, Status
from suanli.executors.local import FAILURE_FILE, STOP_FILE, create_exclusive, read_json
from suanli.executors.ray_connect import bounded, connect, first_line
from suanli.executors.ray_gang import (
    Report,
    actor_name,
    bundle_for,
    final_record,
    first_failure,
    group_name,
    status_of,
)
from suanli.executors.ray_nodes import engine_nodes, own_gpus
from suanli.storage.archive import DEFAULT_LIMITS, Limits, packed_bound

FINAL_FILE = "ray-final"  # the attempt's final Status, once every rank ended: later polls return it
CLEANED_FILE = "ray-cleaned"  # actors killed and placement group removed
NODE_ID_LABEL = "ray.io/node-id"
LOG_CHUNK = 1 << 20  # bytes of one rank's log per actor call
LOG_CALLS_PER_POLL = 8  # a poll copies at most this many chunks per rank; the rest comes with the next poll
LOCAL_ADDRS = ("", "127.0.0.1", "localhost")
NODE_DEATH_WAIT_S = 5.0  # an actor died: how long to look for its node's death in Ray's node table, to name it

log = logging.getLogger(__name__)
_remote_class: Any = None


class RayLaunchError(RuntimeError):
    """The attempt could not start on the nodes asked for (placement group or actors not ready in time)."""


class RayExecutor:
    """Node-ranks as detached actors on a Ray cluster at `address` (`host:port` of its GCS).

    `node_root` is where each rank's workdir and logs live on its node; `ready_timeout_s` bounds the wait for the
    placement group and the actors' start, `call_timeout_s` each poll's questions to the actors; `cpus_per_rank`
    is what a bundle reserves besides the GPUs when the workload states no CPUs. `auth_token` (Ray's token
    authentication, on by default for clusters started with a token) is put into this process's environment
    before connecting, as Ray reads it from there. A Ray driver terminates its whole process once the GCS has been
    unreachable for RAY_gcs_rpc_server_reconnect_timeout_s (Ray's default: 60 s), which would take the server with
    it: unless that variable is set already, it becomes `gcs_outage_s` here."""

    name = "ray"

    def __init__(
        self,
        address: str,
        namespace: str = "suanli",
        *,
        node_root: str = "/tmp/suanli-ray",
        ready_timeout_s: float = 60.0,
        call_timeout_s: float = 5.0,
        cpus_per_rank: float = 1.0,
        auth_token: str | None = None,
        workdir_limits: Limits = DEFAULT_LIMITS,
        gcs_outage_s: float = 7 * 86400.0,
    ) -> None:
        self.address = address
        self.namespace = namespace
        self.node_root = node_root
        self.ready_timeout_s = ready_timeout_s
        self.call_timeout_s = call_timeout_s
        self.cpus_per_rank = cpus_per_rank
        self.auth_token = auth_token
        self.workdir_limits = workdir_limits  # the server's (`workdir_max_bytes`, `_files`): packed and unpacked
        self.gcs_outage_s = gcs_outage_s
        self._actors: dict[str, Any] = {}

    # -- connection ---------------------------------------------------------------------------------------------

    def _ray(self) -> Any:
        """The `ray` module, connected to our cluster as a driver (once per process)."""
        return connect(self.address, self.namespace, self.auth_token, self.gcs_outage_s)

    def _runner(self) -> Any:
        global _remote_class
        if _remote_class is None:
            from suanli.executors.ray_actor import RankRunner

            _remote_class = self._ray().remote(RankRunner)
        return _remote_class

    def _bounded(self, fn: Callable[[], Any], timeout: float | None = None) -> Any:
        """`fn()` (a call that may wait on the GCS), or TimeoutError once `timeout` (call_timeout_s) has passed."""
        return bounded(fn, self.call_timeout_s if timeout is None else timeout)

    def _actor(self, name: str) -> Any | None:
        """The named actor's handle, or None when Ray knows no live actor by that name (TimeoutError: no answer)."""
        if name not in self._actors:
            ray = self._ray()
            try:
                self._actors[name] = self._bounded(lambda: ray.get_actor(name, namespace=self.namespace))
            except ValueError:
                return None
        return self._actors[name]

    # -- discovery ----------------------------------------------------------------------------------------------

    def nodes(self) -> list[EngineNode]:
        """The cluster's nodes (dead ones too, with Ray's reason); see `ray_nodes` for names and models."""
        raws = self._node_table()
        available = ours = None
        with contextlib.suppress(Exception):  # without them, busy_gpus stays 0
            usage = self._gcs().get_all_resource_usage(timeout=self.call_timeout_s)
            available = {b.node_id.hex(): dict(b.resources_available) for b in usage.resource_usage_data.batch}
            # Ray's C++ state accessor (placement_group_table) aborts the process when the GCS does not answer:
            # asked only right after the GCS answered through the Python client above.
            ours = own_gpus(self._bounded(self._ray().util.placement_group_table))
        return engine_nodes(raws, available, ours)

    def _gcs(self) -> Any:
        """The driver's Python GCS client: it raises on a timeout, where `ray.nodes()` (the C++ state accessor)
        aborts the whole process (`global_state_accessor.cc`, seen when a node had just been restarted)."""
        ray = self._ray()
        return ray._private.worker.global_worker.gcs_client

    def _node_table(self) -> list[dict[str, Any]]:
        """Every node the GCS knows, in `ray.nodes()`'s shape (the keys `ray_nodes` reads)."""
        infos = self._gcs().get_all_node_info(timeout=self.call_timeout_s)
        return [{"NodeID": info.node_id.hex(), "Alive": info.state == 0, "NodeName": info.node_name,
                 "NodeManagerAddress": info.node_manager_address, "NodeManagerHostname": info.node_manager_hostname,
                 "Resources": dict(info.resources_total), "Labels": dict(info.labels),
                 "DeathReason": int(info.death_info.reason), "DeathReasonMessage": info.death_info.reason_message}
                for info in infos.values()]  # fmt: skip

    def _node_death(self, host: str) -> str | None:
        """Why Ray says node `host` is dead, or None while it is alive (or Ray cannot be asked)."""
        try:
            for raw in self._node_table():
                if raw.get("NodeID") == host:
                    if raw.get("Alive"):
                        return None
                    return str(raw.get("DeathReasonMessage") or "it is dead")
        except Exception:
            return None
        return "Ray no longer knows it"

    # -- launch -------------------------------------------------------------------------------------------------

    def launch(self, launch: Launch, now: float) -> dict[str, Any]:
        """Reserve the ranks' GPUs on their nodes and start one actor per rank; raise RayLaunchError if that does
        not happen within ready_timeout_s (nothing is left behind then)."""
        from suanli.workdir_upload import pack_workdir

        for rank in launch.ranks:
            if not rank.host:
                raise ValueError(f"node-rank {rank.node_rank} on {rank.node} has no Ray node id (NodeRank.host)")
        if launch.master_addr in LOCAL_ADDRS and len(launch.ranks) > 1 and launch.ranks[0].address:
            from dataclasses import replace

            launch = replace(launch, master_addr=launch.ranks[0].address)  # rank 0's node, not ours
        ray = self._ray()
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        for rank in launch.ranks:  # a node that died after it was chosen: fail now, not after ready_timeout_s
            death = self._node_death(rank.host)
            if death is not None:
                raise RayLaunchError(f"node {rank.node} died before the launch: {death}")
        log_dir = launch.log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        for stale in (STOP_FILE, FAILURE_FILE, FINAL_FILE, CLEANED_FILE):
            (log_dir / stale).unlink(missing_ok=True)
        tar = pack_workdir(launch.workdir, packed_bound(self.workdir_limits))
        pg_name = group_name(launch.workload_id, launch.attempt)
        bundles = [bundle_for(launch, r, self.cpus_per_rank) for r in launch.ranks]
        # Detached: it must outlive this driver (a server restart). Pinned by label selector, never a node Ray picks.
        pg = placement_group(bundles, strategy="PACK", name=pg_name, lifetime="detached",
                             bundle_label_selector=[{NODE_ID_LABEL: r.host} for r in launch.ranks])  # fmt: skip
        handle: dict[str, Any] = {
            "executor": self.name,
            "version": 1,
            "address": self.address,
            "namespace": self.namespace,
            "log_dir": str(log_dir),
            "grace_s": launch.grace_s,
            "launched_at": now,
            "placement_group": {"name": pg_name, "id": pg.id.hex()},
            "ranks": [],
        }
        for rank in launch.ranks:
            log_file = log_dir / f"rank-{rank.node_rank}.log"
            log_file.touch()  # there from the start, as on the local executor; filled by each poll
            handle["ranks"].append({
                "node_rank": rank.node_rank, "node": rank.node, "host": rank.host,
                "actor": actor_name(launch.workload_id, launch.attempt, rank.node_rank),
                "log_file": str(log_file), "log_base": log_file.stat().st_size,  # a reused log_dir's earlier lines
            })  # fmt: skip
        deadline = time.monotonic() + self.ready_timeout_s
        try:
            if not pg.wait(timeout_seconds=max(1, int(self.ready_timeout_s))):
                raise RayLaunchError(self._why_not_placed(launch, bundles))
            tar_ref = ray.put(tar)
            runner = self._runner()
            refs = []
            for i, (_rank, bundle) in enumerate(zip(launch.ranks, bundles, strict=True)):
                actor = runner.options(
                    name=handle["ranks"][i]["actor"], namespace=self.namespace, lifetime="detached", max_restarts=0,
                    max_task_retries=0, num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0),
                    scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i),
                ).remote()  # fmt: skip
                self._actors[handle["ranks"][i]["actor"]] = actor
                refs.append(actor.start.remote(launch, i, self.node_root, tar_ref, self.workdir_limits))
            left = max(1.0, deadline - time.monotonic())
            try:
                started = ray.get(refs, timeout=left)
            except ray.exceptions.GetTimeoutError as e:
                raise RayLaunchError(f"the ranks' actors did not start within {self.ready_timeout_s:g}s") from e
            for rank, where in zip(launch.ranks, started, strict=True):
                if where["node_id"] != rank.host:  # the label selector failed us: never run where Ray chose
                    raise RayLaunchError(f"rank {rank.node_rank} started on {where['node_id']}, not {rank.host}")
        except BaseException as e:
            self._cleanup(handle)
            if isinstance(e, RayLaunchError | KeyboardInterrupt):
                raise
            raise RayLaunchError(f"could not start on Ray: {e}") from e
        return handle

    def _why_not_placed(self, launch: Launch, bundles: list[dict[str, float]]) -> str:
        parts = []
        for rank, bundle in zip(launch.ranks, bundles, strict=True):
            dead = self._node_death(rank.host)
            if dead:
                parts.append(f"node {rank.node} ({rank.host[:12]}) is dead: {dead}")
            else:
                parts.append(f"rank {rank.node_rank} on {rank.node} wants {bundle}")
        return f"placement group not ready within {self.ready_timeout_s:g}s: " + "; ".join(parts)

    # -- watching -----------------------------------------------------------------------------------------------

    def _ask(self, handle: dict[str, Any]) -> dict[int, Report]:
        """Each rank's report: state running/exited/lost (+ exit_code, reason, ended_at, drained); logs copied."""
        ray = self._ray()
        from ray.exceptions import ActorUnavailableError, RayActorError

        reports: dict[int, Report] = {}
        pending: dict[int, tuple[dict[str, Any], Any, Any]] = {}
        for rank in handle["ranks"]:
            n = int(rank["node_rank"])
            try:
                actor = self._actor(rank["actor"])
            except TimeoutError as e:
                reports[n] = self._unreachable(rank, str(e))
                continue
            if actor is None:
                reports[n] = self._lost(rank, "its actor is gone")
                continue
            pending[n] = (rank, actor, actor.status.remote(self._offset(rank), LOG_CHUNK))
        refs = [ref for _, _, ref in pending.values()]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self.call_timeout_s) if refs else ([], [])
        for n, (rank, actor, ref) in pending.items():
            if ref not in ready:
                reports[n] = self._unreachable(rank, "no answer in time")
                continue
            try:
                reply = ray.get(ref, timeout=self.call_timeout_s)
                for _ in range(LOG_CALLS_PER_POLL):
                    if not self._append(rank, reply):
                        break
                    reply = ray.get(actor.status.remote(self._offset(rank), LOG_CHUNK), timeout=self.call_timeout_s)
                reports[n] = {**reply, "drained": self._offset(rank) >= int(reply["size"])}
            except ActorUnavailableError as e:
                reports[n] = self._unreachable(rank, str(e))
            except RayActorError as e:
                self._actors.pop(rank["actor"], None)
                reports[n] = self._lost(rank, f"its actor died: {first_line(e)}")
            except Exception as e:  # a timeout, or Ray itself in trouble: ask again next poll
                reports[n] = self._unreachable(rank, first_line(e))
        return reports

    def _offset(self, rank: dict[str, Any]) -> int:
        try:
            return Path(rank["log_file"]).stat().st_size - int(rank.get("log_base", 0))
        except OSError:
            return 0

    def _append(self, rank: dict[str, Any], reply: dict[str, Any]) -> bool:
        """Copy the chunk the actor sent to the server's log; whether more is waiting on the node."""
        data = reply.get("data") or b""
        if data:
            with open(rank["log_file"], "ab") as f:
                f.write(data)
        return bool(data) and self._offset(rank) < int(reply["size"])

    def _lost(self, rank: dict[str, Any], why: str) -> dict[str, Any]:
        dead = self._node_death(rank["host"])
        deadline = time.monotonic() + NODE_DEATH_WAIT_S
        while dead is None and time.monotonic() < deadline:  # an actor's death is known before its node's
            time.sleep(0.5)
            dead = self._node_death(rank["host"])
        reason = f"node {rank['node']} died: {dead}" if dead else f"rank {rank['node_rank']} on {rank['node']}: {why}"
        return {"state": "lost", "exit_code": None, "reason": reason, "ended_at": None, "drained": True}

    def _unreachable(self, rank: dict[str, Any], why: str) -> dict[str, Any]:
        if self._node_death(rank["host"]):
            return self._lost(rank, why)
        return {"state": "running", "reason": f"rank {rank['node_rank']} unreachable: {why}", "drained": False}

    def poll(self, handle: dict[str, Any], now: float) -> Status:
        """The gang's state, as on the local executor: running while any rank runs; one rank failing (or lost)
        stops the others; the first failure is named. Never raises because an actor or node vanished."""
        log_dir = Path(handle["log_dir"])
        final = read_json(log_dir / FINAL_FILE)
        if final is not None:
            self._cleanup(handle)
            return status_of(final)
        try:
            reports = self._ask(handle)
        except Exception as e:  # Ray unreachable: nothing is known, so nothing has ended
            return Status("running", reason=f"cannot reach Ray: {first_line(e)}")
        stop = read_json(log_dir / STOP_FILE)
        failure = read_json(log_dir / FAILURE_FILE)
        if failure is None and (found := first_failure(reports, len(handle["ranks"]), now)) is not None:
            create_exclusive(log_dir / FAILURE_FILE, json.dumps({**found, "at": now}))
            failure = read_json(log_dir / FAILURE_FILE) or found
        record = final_record(reports, failure, stop)
        if record is None:
            ending = failure is not None or stop is not None
            if ending and any(r["state"] == "running" for r in reports.values()):
                self.stop(handle, now, by="user" if failure is None else "gang")
            return Status("running", reason="stopping" if ending else "")
        create_exclusive(log_dir / FINAL_FILE, json.dumps(record))
        self._cleanup(handle)
        return status_of(read_json(log_dir / FINAL_FILE) or record)

    # -- stopping -----------------------------------------------------------------------------------------------

    def stop(self, handle: dict[str, Any], now: float, by: str = "user") -> None:
        """Ask every rank to stop (SIGTERM, SIGKILL after grace_s, by each rank's supervisor). Non-blocking and
        idempotent: the first request's time and author count."""
        create_exclusive(Path(handle["log_dir"]) / STOP_FILE, json.dumps({"at": now, "by": by}))
        for rank in handle["ranks"]:
            with contextlib.suppress(Exception):  # unreachable now: the next poll asks again
                actor = self._actor(rank["actor"])
                if actor is not None:
                    actor.stop.remote()  # fire and forget: a dead actor's call fails on its own

    def _cleanup(self, handle: dict[str, Any]) -> None:
        """Once the attempt ended: the actors remove their node files and go, the placement group goes. Idempotent."""
        marker = Path(handle["log_dir"]) / CLEANED_FILE
        if marker.exists():
            return
        ray = self._ray()

        def clean() -> None:
            from ray.util.placement_group import PlacementGroup

            actors = [(r["actor"], a) for r in handle["ranks"] if (a := self._actor(r["actor"])) is not None]
            refs = [a.cleanup.remote() for _, a in actors]
            with contextlib.suppress(Exception):
                ray.wait(refs, num_returns=len(refs), timeout=self.call_timeout_s)
            for name, actor in actors:
                with contextlib.suppress(Exception):
                    ray.kill(actor, no_restart=True)
                self._actors.pop(name, None)
            pg = PlacementGroup(ray.PlacementGroupID(bytes.fromhex(handle["placement_group"]["id"])))
            with contextlib.suppress(Exception):
                ray.util.remove_placement_group(pg)
            with contextlib.suppress(OSError):
                marker.write_text(f"{time.time()}\n")

        try:  # a cleanup that outlives the wait goes on in its thread; until it is done, polls try again
            self._bounded(clean, timeout=4 * self.call_timeout_s)
        except Exception as e:
            log.warning("could not clean up Ray attempt %s yet: %s", handle["placement_group"]["name"], e)

    # -- logs ---------------------------------------------------------------------------------------------------

    def log_path(self, handle: dict[str, Any], node_rank: int = 0) -> Path | None:
        """The server's copy of a rank's log (brought up to date by `poll`)."""
        for rank in handle["ranks"]:
            if int(rank["node_rank"]) == node_rank:
                return Path(rank["log_file"])
        return None
