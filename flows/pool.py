"""Several hosts: `regimen pool setup`, and the rule that `regimen serve` is the one-host path.

`regimen pool setup --store s3://bucket/prefix [--pool regimen]` makes, on the Prefect server that
PREFECT_API_URL names (and again, changing nothing else, when rerun):
- a **process work pool** (Prefect's own: `prefect worker start --pool regimen --limit 1` on each host;
  `--limit 1` is the worker's own cap: one flow run at a time per host, so one training per device);
- the deployments `regimen-cycle/on-demand` and `/nightly` in that pool, with serve's guarded parameters
  (`deploy.deployment_options`: the closed schema, the recipe chosen from the configs folder, the
  allow-list and the operator's limits, passed as the runs' environment like serve's). Their entrypoint is
  the module path `regimen.flows.cycle.regimen_cycle`, imported from the regimen installed on the host that
  runs it, with one pull step (`set_working_directory`) to the project folder as it is on this machine:
  every host keeps the project at the same path, as with `prefect deploy` (prefect.yaml);
- **what a lost host needs**, two automations (below).

A host lost mid-run. Prefect's flow engine sends a `prefect.flow-run.heartbeat` event every
PREFECT_FLOWS_HEARTBEAT_FREQUENCY seconds from the flow run's own process (set in the deployments' job
variables, so every host sends them without its own setting; Prefect's minimum is 30 s). We chose two
automations over the alternatives:
- `regimen-host-lost` (a proactive trigger: after a heartbeat of a run of these deployments, neither
  another heartbeat nor a terminal state within `host_lost_after_s`) sets the run to a Crashed state
  named `HostLost`. A deployment's retries do not apply: they are run by the flow's own engine, which died
  with its host; and the worker that would report the crash died too. Nothing but the server can notice.
- `regimen-host-lost-rerun` (reactive, on `prefect.flow-run.HostLost`, the state's own event) sets that
  same run back to Scheduled, as the UI's Retry does: same run, same parameters, its history in one place.
  A live worker of the pool takes it; the stages reuse what is committed in the bucket and the stage that
  was training resumes from the bucket's newest checkpoint. Only `HostLost` runs are rescheduled: a run
  that crashed for any other reason (a worker that saw its run die) stays Crashed for a person to read,
  so a run that kills its host every time is not rescheduled forever by a rule that cannot tell.
  A `RunDeployment` action instead would start a new run with a second history and needs the parameters
  templated back in; rescheduling keeps Prefect's own run.
The run on the new host must not be refused by the experiment's lease of the dead host, which it must not
take before it expires: `host_lost_after_s` is at least the lease's time to live (REGIMEN_LEASE_TTL_S,
120 s by default) plus a heartbeat, so by the time the run is rescheduled the lease has expired.

`regimen serve` and the pool's deployments have the same names: serve is refused while the pool's exist,
and pool setup while a serve serves (`claim_serve`).
"""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

from regimen.stages.core.errors import InputError

SERVE_LIMIT = "regimen-serve"
SERVE_LEASE_S = 60.0  # the least Prefect's server takes; renewed every third of it
HOST_LOST = "HostLost"
AUTOMATION_CRASH = "regimen-host-lost"
AUTOMATION_RERUN = "regimen-host-lost-rerun"
DEFAULT_POOL = "regimen"
DEFAULT_HEARTBEAT_S = 30
WORKER_COMMAND = "prefect worker start --pool {pool} --limit 1"
_HELD: dict[str, UUID] = {}  # serve's current lease (taken anew if the server lost it), released when serve stops


# -- serve is the one-host path ------------------------------------------------------------------------

def pool_deployments() -> dict[str, str]:
    """`on-demand`/`nightly` of regimen-cycle as the server holds them, that belong to a work pool: name -> pool."""
    from prefect import get_client
    from prefect.exceptions import ObjectNotFound

    from regimen.flows.deploy import FLOW, NIGHTLY, ON_DEMAND

    found = {}
    with get_client(sync_client=True) as client:
        for name in (ON_DEMAND, NIGHTLY):
            try:
                d = client.read_deployment_by_name(f"{FLOW}/{name}")
            except ObjectNotFound:
                continue
            if d.work_pool_name:
                found[name] = d.work_pool_name
    return found


def refuse_serve_beside_a_pool() -> None:
    found = pool_deployments()
    if found:
        pool = sorted(set(found.values()))[0]
        raise InputError(f"regimen-cycle/{', /'.join(sorted(found))} belong to the work pool {pool!r} (`regimen pool setup`): their runs go to "
                         f"that pool's workers (`{WORKER_COMMAND.format(pool=pool)}` on each host), so `regimen serve` is refused here; to "
                         "serve on one host instead, delete them first (`prefect deployment delete regimen-cycle/on-demand`, and /nightly)")


def claim_serve() -> UUID:
    """Take the one slot of the global concurrency limit `regimen-serve` with a lease of 60 s, or refuse.

    Why a concurrency lease: it is Prefect's own object for "one holder at a time", taken atomically by
    the server, so two serves starting in the same second cannot both get it. The holder renews it every
    20 s (`keep_serve_claim`) and releases it when it stops (Ctrl-C, SIGTERM): a serve restarted at once
    is not refused. A serve that died (SIGKILL, its machine gone) stops renewing; Prefect's repossessor
    frees the slot once the lease expires, within 75 s. A slot left taken with no lease behind it (a
    server restarted with its leases in memory) is told apart from a live serve by the deployments'
    `last_polled`, which a live serve's runner updates every PREFECT_RUNNER_POLL_FREQUENCY seconds: a slot
    whose deployments nobody polled for 2 minutes is reset and taken. The deployments' `last_polled` alone
    would refuse a serve restarted right after a clean stop for a minute and more."""
    from prefect import get_client

    with get_client(sync_client=True) as client:
        client.upsert_global_concurrency_limit_by_name(SERVE_LIMIT, 1)
    for attempt in (1, 2):
        lease = asyncio.run(_take())
        if lease is not None:
            _HELD["lease"] = lease
            return lease
        if attempt == 1 and not _served_lately():
            _reset_stale_slot()
            continue
        raise InputError("another `regimen serve` is serving regimen-cycle/on-demand and /nightly from this Prefect server (it holds the "
                         f"concurrency limit {SERVE_LIMIT!r}): one host serves; for several hosts use a work pool: `regimen pool setup "
                         f"--store s3://bucket/prefix`, then `{WORKER_COMMAND.format(pool=DEFAULT_POOL)}` on each host (a serve that died "
                         f"frees it within {SERVE_LEASE_S + 15:.0f} s)")
    raise AssertionError("unreachable")  # pragma: no cover


async def _take() -> UUID | None:
    import httpx
    from prefect import get_client

    async with get_client() as client:
        try:
            response = await client.increment_concurrency_slots_with_lease([SERVE_LIMIT], 1, "concurrency", SERVE_LEASE_S)
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code == 423:  # Locked: the slot is taken
                return None
            raise
    return UUID(response.json()["lease_id"])


def _served_lately(within_s: float = 120.0) -> bool:
    from datetime import datetime, timezone

    from prefect import get_client
    from prefect.exceptions import ObjectNotFound

    from regimen.flows.deploy import FLOW, NIGHTLY, ON_DEMAND

    with get_client(sync_client=True) as client:
        for name in (ON_DEMAND, NIGHTLY):
            try:
                d = client.read_deployment_by_name(f"{FLOW}/{name}")
            except ObjectNotFound:
                continue
            if d.last_polled and (datetime.now(timezone.utc) - d.last_polled).total_seconds() < within_s:
                return True
    return False


def _reset_stale_slot() -> None:
    from prefect import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate

    with get_client(sync_client=True) as client:
        client.update_global_concurrency_limit(SERVE_LIMIT, GlobalConcurrencyLimitUpdate(active_slots=0))


async def keep_serve_claim(lease: UUID, period_s: float = SERVE_LEASE_S / 3) -> None:
    """Renew serve's lease until cancelled; a lease the server no longer knows (it restarted) is taken anew."""
    import logging

    from prefect import get_client

    log = logging.getLogger("regimen.serve")
    while True:
        await asyncio.sleep(period_s)
        try:
            async with get_client() as client:
                await client.renew_concurrency_lease(lease, SERVE_LEASE_S)
        except Exception as exc:  # noqa: BLE001 - the API is down (serve waits for it) or the lease is gone
            if getattr(getattr(exc, "response", None), "status_code", None) == 404:
                # the server lost its leases (restarted; they live in its memory) but not the slot they held,
                # which is this serve's own: free it and take it again, so a later serve is not refused
                lease = await _retake() or lease
                _HELD["lease"] = lease
            else:
                log.debug("renewing serve's lease failed: %s", exc)


async def _retake() -> UUID | None:
    from prefect import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate

    lease = await _take()
    if lease is None:
        async with get_client() as client:
            await client.update_global_concurrency_limit(SERVE_LIMIT, GlobalConcurrencyLimitUpdate(active_slots=0))
        lease = await _take()
    return lease


def release_serve(lease: UUID) -> None:
    from prefect import get_client

    lease = _HELD.pop("lease", lease)
    try:
        with get_client(sync_client=True) as client:
            client.release_concurrency_slots_with_lease(lease)
    except Exception:  # noqa: BLE001 - the server is gone: the lease expires on its own
        pass


def refuse_pool_while_serving() -> None:
    """pool setup while a serve holds `regimen-serve` (a live one: its lease is renewed) is refused."""
    from prefect import get_client

    lease = asyncio.run(_take()) if _limit_exists() else None
    if lease is not None:
        with get_client(sync_client=True) as client:
            client.release_concurrency_slots_with_lease(lease)
        return
    if not _limit_exists():
        return
    if _served_lately():
        raise InputError(f"a `regimen serve` is serving regimen-cycle/on-demand and /nightly from this Prefect server (it holds {SERVE_LIMIT!r}): "
                         "stop it first (Ctrl-C); the work pool's deployments take the same names")


def _limit_exists() -> bool:
    from prefect import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(SERVE_LIMIT)
            return True
        except ObjectNotFound:
            return False


# -- pool setup ------------------------------------------------------------------------------------------

def check_store_url(store: str) -> None:
    """A store every host can reach: a bucket URL, reachable and honouring conditional writes (one line otherwise)."""
    from fsspec.core import split_protocol

    protocol = split_protocol(store)[0] if store else None
    if not store or protocol in (None, "file", "local", "memory"):
        raise InputError(f"--store {store!r}: a work pool's hosts share one store, so give a bucket URL that each of them can reach "
                         "(s3://bucket/prefix); a folder or memory:// is this host's alone")
    if protocol in ("s3", "s3a"):
        rest = store.split("://", 1)[1]
        if not rest or rest.startswith("/") or not rest.split("/", 1)[0]:
            raise InputError(f"--store {store!r}: no bucket name (s3://bucket/prefix)")
    try:
        from regimen.stages.run.preflight import check_store
    except ImportError:  # pragma: no cover - another layout
        from regimen.stages.preflight import check_store  # type: ignore[no-redef]
    try:
        check_store(store)
    except (ImportError, ValueError) as exc:
        raise InputError(f"--store {store!r}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__} (for s3://, pip install 'regimen-rl[s3]')") from None


def host_lost_after(heartbeat_s: int, lease_ttl_s: float | None = None) -> int:
    """Seconds without a heartbeat before a run's host is presumed lost: the store lease's time to live
    plus one heartbeat (so the lease has expired when the run is rescheduled), and a heartbeat plus 15 s at
    least (150 s with the defaults: five heartbeats missed)."""
    from regimen.stages.store import lock

    ttl = lease_ttl_s if lease_ttl_s is not None else lock.LEASE_TTL_S
    return int(max(ttl + heartbeat_s, heartbeat_s + 15))


def pool_setup(store: str, *, pool: str = DEFAULT_POOL, config: str = "configs/default.yaml", configs_dir: str | None = None,
               cron: str = "0 2 * * *", timezone: str = "UTC", allow: list[str] | None = None, limits: dict[str, Any] | None = None,
               heartbeat_s: int = DEFAULT_HEARTBEAT_S, host_lost_after_s: int | None = None, allow_unauthenticated: bool = False) -> dict[str, Any]:
    """Create or update the pool, its two deployments and the two automations; returns what was made."""
    from regimen.flows import deploy
    from regimen.stages.recipe import load_recipe

    if heartbeat_s < 30:
        raise InputError(f"--heartbeat-s {heartbeat_s}: Prefect sends flow-run heartbeats at most every 30 s")
    lost_after = host_lost_after_s if host_lost_after_s is not None else host_lost_after(heartbeat_s)
    if lost_after < heartbeat_s + 10:
        raise InputError(f"--host-lost-after-s {lost_after}: must exceed the heartbeat ({heartbeat_s} s) by 10 s at least")
    if not pool or not pool.replace("-", "").replace("_", "").isalnum():
        raise InputError(f"--pool {pool!r}: a work pool name of letters, digits, - and _")
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():
        raise InputError("PREFECT_API_URL is not set: a work pool lives on the Prefect server every host's worker reaches; set it to that server's API")
    deploy.check_api_protected(allow_unauthenticated)
    check_store_url(store)
    deploy.check_schedule(cron, timezone)
    recipe = load_recipe(config, {"store": store})
    saved = {k: os.environ.get(k) for k in ("REGIMEN_CONFIGS", "REGIMEN_STORE", "REGIMEN_UI_ALLOW", "REGIMEN_UI_LIMITS")}
    try:
        name = deploy.operator_environment(config, recipe.store, list(allow or []), configs_dir, limits)
        env = {k: os.environ[k] for k in saved if os.environ.get(k) is not None}
        from regimen.flows.boundary import operator_limits

        load_recipe(config, {"store": recipe.store, **operator_limits()})
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    env["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"] = str(heartbeat_s)
    refuse_pool_while_serving()
    paused = deploy.nightly_paused_by_a_person()
    options = deploy.deployment_options(name, cron=cron, timezone=timezone, nightly_paused=paused)
    ids = asyncio.run(_apply(pool, options, env, Path.cwd().resolve()))
    asyncio.run(_automations(list(ids.values()), lost_after))
    return {"pool": pool, "deployments": ids, "host_lost_after_s": lost_after, "heartbeat_s": heartbeat_s, "config": name, "paused": paused}


async def _apply(pool: str, options: dict[str, dict[str, Any]], env: dict[str, str], project: Path) -> dict[str, UUID]:
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.client.schemas.objects import ConcurrencyOptions
    from prefect.exceptions import ObjectNotFound
    from prefect.workers.process import ProcessWorker

    from regimen.flows.cycle import regimen_cycle
    from regimen.flows.deploy import closed_parameter_schema

    schema = closed_parameter_schema()
    async with get_client() as client:
        try:
            existing = await client.read_work_pool(pool)
            if existing.type != "process":
                raise InputError(f"--pool {pool!r}: a work pool of type {existing.type!r} exists by that name; choose another name (a process pool is made)")
        except ObjectNotFound:
            await client.create_work_pool(WorkPoolCreate(name=pool, type="process", base_job_template=ProcessWorker.get_default_base_job_template(),
                                                         description="Regimen: one worker per host (`prefect worker start --pool "
                                                                     f"{pool} --limit 1`); made by `regimen pool setup`"))
        flow_id = await client.create_flow(regimen_cycle)
        ids = {}
        for name, kw in options.items():
            limit = kw["concurrency_limit"]
            ids[name] = await client.create_deployment(
                flow_id=flow_id, name=name, description=kw["description"], tags=kw["tags"], parameters=kw["parameters"],
                schedules=kw.get("schedules") or [], concurrency_limit=limit.limit,
                concurrency_options=ConcurrencyOptions(collision_strategy=limit.collision_strategy),
                work_pool_name=pool, entrypoint="regimen.flows.cycle.regimen_cycle", path=None, enforce_parameter_schema=True,
                parameter_openapi_schema=schema, job_variables={"env": env},
                pull_steps=[{"prefect.deployments.steps.set_working_directory": {"directory": str(project)}}])
    return ids


async def _automations(deployment_ids: list[UUID], lost_after_s: int) -> None:
    """The two automations of the module doc, replaced whole on each setup (idempotent)."""
    from prefect import get_client
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture

    runs = {"prefect.resource.id": "prefect.flow-run.*"}
    of_ours = {"prefect.resource.role": "deployment", "prefect.resource.id": [f"prefect.deployment.{i}" for i in deployment_ids]}
    ended = {f"prefect.flow-run.{s}" for s in ("Completed", "Failed", "Cancelled", "Crashed", HOST_LOST, "Cancelling", "Paused", "Suspended")}
    crash = AutomationCore(
        name=AUTOMATION_CRASH,
        description=f"A run of the Regimen pool whose flow-run heartbeats stopped for {lost_after_s} s: its host is presumed lost (made by `regimen pool setup`).",
        trigger=EventTrigger(match=runs, match_related=of_ours, after={"prefect.flow-run.heartbeat"},
                             expect={"prefect.flow-run.heartbeat", *ended}, for_each={"prefect.resource.id"},
                             posture=Posture.Proactive, threshold=1, within=timedelta(seconds=lost_after_s)),
        actions=[ChangeFlowRunState(state=StateType.CRASHED, name=HOST_LOST,
                                    message=f"no heartbeat for {lost_after_s} s: its host is presumed lost; rescheduled for a live worker")])
    rerun = AutomationCore(
        name=AUTOMATION_RERUN,
        description="Schedule again a run of the Regimen pool whose host was lost: a live worker takes it and resumes from the store (made by `regimen pool setup`).",
        trigger=EventTrigger(match=runs, match_related=of_ours, expect={f"prefect.flow-run.{HOST_LOST}"}, for_each={"prefect.resource.id"},
                             posture=Posture.Reactive, threshold=1, within=timedelta(0)),
        actions=[ChangeFlowRunState(state=StateType.SCHEDULED,
                                    message="scheduled again: its host was lost; a live worker resumes it from the store's last checkpoint")])
    async with get_client() as client:
        for automation in (crash, rerun):
            found = await client.read_automations_by_name(automation.name)
            if found:
                await client.update_automation(found[0].id, automation)
                for extra in found[1:]:
                    await client.delete_automation(extra.id)
            else:
                await client.create_automation(automation)
