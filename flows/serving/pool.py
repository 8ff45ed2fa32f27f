"""Several hosts: `regimen pool setup`, and the rule that `regimen serve` is the one-host path.

`regimen pool setup --store s3://bucket/prefix [--pool regimen]` makes, on the Prefect server that
PREFECT_API_URL names (and again, changing nothing else, when rerun):
- a **process work pool** (Prefect's own: `prefect worker start --pool regimen --limit 1` on each host;
  `--limit 1` is the worker's own cap: one flow run at a time per host, so one training per device);
- the deployments `regimen-cycle/on-demand` and `/nightly` in that pool, with serve's guarded parameters
  (`deploy.deployment_options`: the closed schema, the recipe chosen from the configs folder, the
  allow-list and the operator's limits, passed as the runs' environment like serve's). Their entrypoint is
  the module path `regimen.flows.pipeline.cycle.regimen_cycle`, imported from the regimen installed on the host that
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
and pool setup while a serve serves (`deploy.claim_serve`, which says why a lease).
"""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.client.schemas.objects import ConcurrencyOptions, StateType
from prefect.events.actions import ChangeFlowRunState
from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture
from prefect.exceptions import ObjectNotFound
from prefect.settings import PREFECT_API_URL
from prefect.workers.process import ProcessWorker

from regimen.flows.serving import deploy
from regimen.flows.serving.boundary import REFUSED
from regimen.flows.serving.deploy import DEFAULT_POOL, closed_parameter_schema, entrypoint
from regimen.stages.core.errors import InputError
from regimen.stages.recipe import load_recipe
from regimen.stages.run.preflight import check_store

HOST_LOST = "HostLost"
AUTOMATION_CRASH = "regimen-host-lost"
AUTOMATION_RERUN = "regimen-host-lost-rerun"
DEFAULT_HEARTBEAT_S = 30


# -- serve is the one-host path: its claim lives in deploy.py -----------------------------------------


def refuse_pool_while_serving() -> None:
    """pool setup while a serve holds `regimen-serve` (a live one: its lease is renewed) is refused."""
    if not deploy.serve_limit_exists():
        return
    with get_client(sync_client=True) as client:
        changed = client.read_global_concurrency_limit_by_name(deploy.SERVE_LIMIT).updated  # before our own try
    lease = asyncio.run(deploy.take_serve_slot())
    if lease is not None:
        with get_client(sync_client=True) as client:
            client.release_concurrency_slots_with_lease(lease)
        return
    if deploy.served_lately() or deploy.lately(changed):  # a live serve, or one still starting (`claim_serve`)
        raise InputError(
            f"a `regimen serve` is serving regimen-cycle/on-demand and /nightly from this Prefect server (it holds "
            f"{deploy.SERVE_LIMIT!r}): stop it first (Ctrl-C); the work pool's deployments take the same names"
        )


# -- pool setup ------------------------------------------------------------------------------------------


def check_store_url(store: str) -> None:
    """A store every host can reach: a bucket URL, reachable and honouring conditional writes (one line otherwise)."""
    from fsspec.core import split_protocol

    protocol = split_protocol(store)[0] if store else None
    if not store or protocol in (None, "file", "local", "memory"):
        raise InputError(
            f"--store {store!r}: a work pool's hosts share one store, so give a bucket URL that each of them can reach "
            "(s3://bucket/prefix); a folder or memory:// is this host's alone"
        )
    if protocol in ("s3", "s3a"):
        rest = store.split("://", 1)[1]
        if not rest or rest.startswith("/") or not rest.split("/", 1)[0]:
            raise InputError(f"--store {store!r}: no bucket name (s3://bucket/prefix)")

    try:
        check_store(store)
    except (ImportError, ValueError) as exc:
        raise InputError(
            f"--store {store!r}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__} (for s3://, pip "
            f"install 'regimen-rl[s3]')"
        ) from None


def host_lost_after(heartbeat_s: int, lease_ttl_s: float | None = None) -> int:
    """Seconds without a heartbeat before a run's host is presumed lost: one heartbeat plus the longer of
    the store lease's time to live (so the lease has expired when the run is rescheduled) and one more
    heartbeat interval (150 s with the defaults: five heartbeats missed). The second term is for a live host
    whose heartbeat is late: Prefect sends it from a thread that sleeps a heartbeat in one-second steps and
    delivers it through its events client, and on a loaded 2-core machine (training beside the server) a
    heartbeat 15 s late was taken for a lost host, and a live run was crashed (CI, 2026-12-06)."""
    from regimen.stages.store import lock

    ttl = lease_ttl_s if lease_ttl_s is not None else lock.LEASE_TTL_S
    return int(heartbeat_s + max(ttl, heartbeat_s))


def pool_setup(
    store: str,
    *,
    flow,
    pool: str = DEFAULT_POOL,
    config: str = "configs/default.yaml",
    configs_dir: str | None = None,
    cron: str = "0 2 * * *",
    timezone: str = "UTC",
    allow: list[str] | None = None,
    limits: dict[str, Any] | None = None,
    heartbeat_s: int = DEFAULT_HEARTBEAT_S,
    host_lost_after_s: int | None = None,
    allow_unauthenticated: bool = False,
) -> dict[str, Any]:
    """Create or update the pool, its two deployments of `flow` (handed in by the command line) and the two
    automations; returns what was made."""
    if heartbeat_s < 30:
        raise InputError(f"--heartbeat-s {heartbeat_s}: Prefect sends flow-run heartbeats at most every 30 s")
    lost_after = host_lost_after_s if host_lost_after_s is not None else host_lost_after(heartbeat_s)
    if lost_after < heartbeat_s + 10:
        raise InputError(
            f"--host-lost-after-s {lost_after}: must exceed the heartbeat ({heartbeat_s} s) by 10 s at least"
        )
    if not pool or not pool.replace("-", "").replace("_", "").isalnum():
        raise InputError(f"--pool {pool!r}: a work pool name of letters, digits, - and _")

    if not PREFECT_API_URL.value():
        raise InputError(
            "PREFECT_API_URL is not set: a work pool lives on the Prefect server every host's worker reaches; set it "
            "to that server's API"
        )
    deploy.check_api_protected(allow_unauthenticated)
    check_store_url(store)
    deploy.check_schedule(cron, timezone)
    recipe = load_recipe(config, {"store": store})
    saved = {
        k: os.environ.get(k) for k in ("REGIMEN_CONFIGS", "REGIMEN_STORE", "REGIMEN_UI_ALLOW", "REGIMEN_UI_LIMITS")
    }
    try:
        name = deploy.operator_environment(config, recipe.store, list(allow or []), configs_dir, limits)
        env = {k: os.environ[k] for k in saved if os.environ.get(k) is not None}
        from regimen.flows.serving.boundary import operator_limits

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
    ids = asyncio.run(_apply(flow, pool, options, env, Path.cwd().resolve()))
    asyncio.run(_automations(list(ids.values()), lost_after))
    return {
        "pool": pool,
        "deployments": ids,
        "host_lost_after_s": lost_after,
        "heartbeat_s": heartbeat_s,
        "config": name,
        "paused": paused,
    }


async def _apply(
    flow, pool: str, options: dict[str, dict[str, Any]], env: dict[str, str], project: Path
) -> dict[str, UUID]:
    schema = closed_parameter_schema(flow)
    async with get_client() as client:
        try:
            existing = await client.read_work_pool(pool)
            if existing.type != "process":
                raise InputError(
                    f"--pool {pool!r}: a work pool of type {existing.type!r} exists by that name; choose another name "
                    f"(a process pool is made)"
                )
        except ObjectNotFound:
            await client.create_work_pool(
                WorkPoolCreate(
                    name=pool,
                    type="process",
                    base_job_template=ProcessWorker.get_default_base_job_template(),
                    description="Regimen: one worker per host (`prefect worker start --pool "
                    f"{pool} --limit 1`); made by `regimen pool setup`",
                )
            )
        flow_id = await client.create_flow(flow)
        ids = {}
        for name, kw in options.items():
            limit = kw["concurrency_limit"]
            ids[name] = await client.create_deployment(
                flow_id=flow_id,
                name=name,
                description=kw["description"],
                tags=kw["tags"],
                parameters=kw["parameters"],
                schedules=kw.get("schedules") or [],
                concurrency_limit=limit.limit,
                concurrency_options=ConcurrencyOptions(collision_strategy=limit.collision_strategy),
                work_pool_name=pool,
                entrypoint=entrypoint(flow),
                path=None,
                enforce_parameter_schema=True,
                parameter_openapi_schema=schema,
                job_variables={"env": env},
                pull_steps=[{"prefect.deployments.steps.set_working_directory": {"directory": str(project)}}],
            )
    return ids


async def _automations(deployment_ids: list[UUID], lost_after_s: int) -> None:
    """The two automations of the module doc, replaced whole on each setup (idempotent)."""
    runs = {"prefect.resource.id": "prefect.flow-run.*"}
    of_ours = {
        "prefect.resource.role": "deployment",
        "prefect.resource.id": [f"prefect.deployment.{i}" for i in deployment_ids],
    }
    ended = {
        f"prefect.flow-run.{s}"
        for s in (
            "Completed",
            "Failed",
            REFUSED,
            "Cancelled",
            "Crashed",
            HOST_LOST,
            "Cancelling",
            "Paused",
            "Suspended",
        )
    }
    crash = AutomationCore(
        name=AUTOMATION_CRASH,
        description=f"A run of the Regimen pool whose flow-run heartbeats stopped for {lost_after_s} s: its host is "
        f"presumed lost (made by `regimen pool setup`).",
        trigger=EventTrigger(
            match=runs,
            match_related=of_ours,
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", *ended},
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=lost_after_s),
        ),
        actions=[
            ChangeFlowRunState(
                state=StateType.CRASHED,
                name=HOST_LOST,
                message=f"no heartbeat for {lost_after_s} s: its host is presumed lost; rescheduled for a live worker",
            )
        ],
    )
    rerun = AutomationCore(
        name=AUTOMATION_RERUN,
        description="Schedule again a run of the Regimen pool whose host was lost: a live worker takes it and resumes "
        "from the store (made by `regimen pool setup`).",
        trigger=EventTrigger(
            match=runs,
            match_related=of_ours,
            expect={f"prefect.flow-run.{HOST_LOST}"},
            for_each={"prefect.resource.id"},
            posture=Posture.Reactive,
            threshold=1,
            within=timedelta(0),
        ),
        actions=[
            ChangeFlowRunState(
                state=StateType.SCHEDULED,
                message="scheduled again: its host was lost; a live worker resumes it from the store's last checkpoint",
            )
        ],
    )
    async with get_client() as client:
        for automation in (crash, rerun):
            found = await client.read_automations_by_name(automation.name)
            if found:
                await client.update_automation(found[0].id, automation)
                for extra in found[1:]:
                    await client.delete_automation(extra.id)
            else:
                await client.create_automation(automation)
