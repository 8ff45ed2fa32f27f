"""Deployments of the flow `regimen-cycle`: `on-demand` (no schedule: the UI's Run button) and `nightly`
(a cron schedule), served by this process with Prefect's Runner (`_serve`: Prefect's `serve` built from
its public parts, so that runs execute this process's flow object). `prefect.yaml` makes the same two
deployments for a process work pool (`prefect deploy --all`, then `prefect worker start`).

The parameters a person fills in on the UI's "Custom run" form are the flow's own (config, experiment,
overrides); Prefect builds their schema and descriptions from `regimen_cycle`'s signature and docstring,
and the server refuses a run whose parameters do not fit it (HTTP 409), unknown names included. What
they may choose is an allow-list (`boundary.py`): a recipe from the configs folder, an experiment name,
training hyperparameters. The store, and any key the operator widens the list with (`--allow`), are the
operator's, passed to the flow runs through this process's environment (REGIMEN_STORE, REGIMEN_CONFIGS,
REGIMEN_UI_ALLOW), which the runs inherit.

One device, one training at a time:
- this process starts at most one flow run at a time (`limit=1`), across both deployments; a run that
  arrives while another runs stays Scheduled (queued, never dropped) and starts when the device is free;
- each deployment also has `concurrency_limit: 1` with collision strategy ENQUEUE, so even two `serve`
  processes (or a worker and a `serve`) never run two runs of one deployment at once: the second one waits
  as `AwaitingConcurrencySlot`.
Two runs of one experiment are refused by the store's lock either way (ExperimentBusy).

`serve` is the one-host path: it is refused at once while another serve serves from the same Prefect
server (it holds the global concurrency limit `regimen-serve` by a lease it renews) or while the work
pool's deployments of the same names exist (`regimen pool setup`); `claim_serve` says why a lease.

The nightly schedule's on/off state belongs to the server, not to this process. Stopping `serve` (Ctrl-C,
SIGTERM) does not pause it (`pause_on_shutdown=False`; Prefect's default pauses every served deployment
on shutdown and deletes its scheduled runs until the next `serve`): runs due while nothing serves them
show as Late in the UI and start when `regimen serve` (or a worker) runs again. Starting `serve` does not
resume a schedule a person paused (in the UI, or `prefect deployment schedule pause`): it is registered
paused again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import signal
import stat
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from uuid import UUID

from prefect import get_client
from prefect.client.schemas.actions import DeploymentScheduleCreate, DeploymentUpdate, GlobalConcurrencyLimitUpdate
from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
from prefect.client.schemas.schedules import CronSchedule
from prefect.deployments.runner import EntrypointType
from prefect.exceptions import ObjectNotFound, TerminationSignal
from prefect.runner import Runner
from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_KEY, PREFECT_API_URL
from prefect.utilities.callables import parameter_schema
from pydantic import ValidationError

from regimen.flows.serving import boundary
from regimen.flows.serving.boundary import operator_limits, record_digest
from regimen.stages.core.errors import InputError
from regimen.stages.recipe import load_recipe, read_yaml

FLOW = "regimen-cycle"
ON_DEMAND = "on-demand"
NIGHTLY = "nightly"
DEFAULT_CRON = "0 2 * * *"
ONE_AT_A_TIME = ConcurrencyLimitConfig(limit=1, collision_strategy=ConcurrencyLimitStrategy.ENQUEUE)


def deployment_options(
    config: str, *, cron: str = DEFAULT_CRON, timezone: str = "UTC", nightly_paused: bool = False
) -> dict[str, dict[str, Any]]:
    """The two deployments' options (`Runner.add_flow` keyword arguments), with `config` (a recipe name
    inside the configs folder) as their default."""
    common: dict[str, Any] = dict(
        parameters={"config": config},
        concurrency_limit=ONE_AT_A_TIME,
        enforce_parameter_schema=True,
        # recorded for people; serve runs its own flow object, never the entrypoint
        entrypoint_type=EntrypointType.MODULE_PATH,
        tags=["regimen"],
    )
    return {
        ON_DEMAND: dict(
            description=f"Run the recipe {config} now (the UI's Run button; Custom run to change the recipe, "
            f"experiment or overrides).",
            **common,
        ),
        NIGHTLY: dict(
            schedules=[
                DeploymentScheduleCreate(schedule=CronSchedule(cron=cron, timezone=timezone), active=not nightly_paused)
            ],
            description=f"Retrain on {config} every night ({cron}, {timezone}): stages whose recipe, data and inputs "
            f"are unchanged are reused.",
            **common,
        ),
    }


def entrypoint(flow) -> str:
    """Where a worker imports the flow from (a module path), read off the flow object itself, so that it
    follows the flow wherever its module lives."""
    return f"{flow.fn.__module__}.{flow.fn.__name__}"


def closed_parameter_schema(flow) -> dict[str, Any]:
    """The flow's parameter schema (Prefect's public `parameter_schema`) with `additionalProperties:
    false`, so the server also refuses an unknown parameter (a typo such as `overide`) with 409 instead
    of creating a run that crashes."""
    schema = parameter_schema(flow).model_dump_for_openapi()
    schema["additionalProperties"] = False
    return schema


def check_schedule(cron: str, timezone: str) -> None:
    """Refuse a bad cron expression or time zone before anything is registered (exit code 2)."""
    try:
        CronSchedule(cron=cron, timezone=timezone)
    except ValidationError as exc:
        raise InputError(f"--cron {cron!r} / --timezone {timezone!r}: {exc.errors()[0]['msg']}") from None


def nightly_paused_by_a_person() -> bool:
    """Whether the nightly deployment, as the server holds it, is paused or has its schedule switched off."""
    with get_client(sync_client=True) as client:
        try:
            d = client.read_deployment_by_name(f"{FLOW}/{NIGHTLY}")
        except ObjectNotFound:
            return False
    return bool(d.paused or (d.schedules and not any(s.active for s in d.schedules)))


def operator_environment(
    config: str, store: str, allow: list[str], configs_dir: str | None = None, limits: dict[str, Any] | None = None
) -> str:
    """Fix the operator's choices for the flow runs this process starts; returns the recipe's name
    inside the configs folder (the deployments' default `config`). UI runs choose recipes from
    `configs_dir` (default: `./configs`), which must hold the served recipe and be writable only by its
    owner (a recipe chooses code and places: whoever can write one there can choose them)."""
    path = Path(config).resolve()
    if not path.is_file():
        raise InputError(f"recipe {config}: file does not exist")
    configs = Path(configs_dir or "configs").resolve()
    if not configs.is_dir():
        raise InputError(f"--configs {configs}: not a folder (UI runs choose their recipe from it)")
    if not path.is_relative_to(configs):
        raise InputError(
            f"recipe {config}: must be inside the configs folder {configs} that UI runs choose from (or pass --configs "
            f"DIR)"
        )
    for folder in [configs, *[p for p in configs.rglob("*") if p.is_dir()]]:
        if folder.stat().st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise InputError(
                f"--configs: {folder} is writable by other users; UI runs choose recipes from it, so it must not be"
            )
    for recipe in [p for p in configs.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file()]:
        boundary.check_owner_only(recipe)
    os.environ["REGIMEN_CONFIGS"] = str(configs)
    os.environ["REGIMEN_STORE"] = store  # always pinned: a recipe UI runs choose never picks the store
    if allow:
        os.environ["REGIMEN_UI_ALLOW"] = ",".join(allow)
    boundary.check_overrides({}, allow)
    os.environ["REGIMEN_UI_LIMITS"] = json.dumps({**boundary.DEFAULT_LIMITS, **(limits or {})})
    return path.relative_to(configs).as_posix()


def check_api_protected(allow_unauthenticated: bool = False) -> None:
    """Serving a Prefect API that other machines can reach, without authentication, is refused: with
    Prefect OSS, anyone who can write to the API is an operator (it has no roles). Exit 2 with what to do."""
    url = PREFECT_API_URL.value() or ""
    host = (urlparse(url).hostname or "").lower()
    local = host in ("", "127.0.0.1", "localhost", "::1") or host.startswith("127.")
    if local or allow_unauthenticated or PREFECT_API_AUTH_STRING.value() or PREFECT_API_KEY.value():
        return
    raise InputError(
        f"PREFECT_API_URL {url}: a Prefect API other machines can reach, without authentication: anyone who can reach "
        f"it could "
        "run flows and change deployments. Start the server with PREFECT_SERVER_API_AUTH_STRING='user:secret' and set "
        "PREFECT_API_AUTH_STRING to the same here (or pass --allow-unauthenticated-api, e.g. behind your own "
        "authenticating proxy)"
    )


def serve_deployments(
    config: str,
    *,
    flow,
    store: str | None = None,
    cron: str = DEFAULT_CRON,
    timezone: str = "UTC",
    allow: list[str] | None = None,
    configs_dir: str | None = None,
    allow_unauthenticated: bool = False,
    limits: dict[str, Any] | None = None,
) -> None:
    """Validate the recipe, register `on-demand` and `nightly` of `flow` (the pipeline's `regimen_cycle`, handed
    in by the command line: serving does not import the pipeline), and run their flow runs until stopped. Refused
    at once while the pool's deployments exist or another serve serves from the same Prefect server (`claim_serve`)."""
    from rich.console import Console

    err = Console(stderr=True, soft_wrap=True, emoji=False)
    check_api_protected(allow_unauthenticated)
    refuse_serve_beside_a_pool()  # serve is the one-host path: not beside a work pool's deployments of the same names

    # until serve's loop runs (`_serve`): a SIGTERM while starting still releases the claim
    def _terminate(signum, frame):
        raise TerminationSignal(signal=signum)

    signal.signal(signal.SIGTERM, _terminate)
    try:
        lease = claim_serve()  # ... nor beside another serve (refused at once)
        _serve_holding(flow, config, store, cron, timezone, allow, configs_dir, limits, lease, err)
    finally:
        if "lease" in _HELD:  # taken (a SIGTERM may come between the server's answer and claim_serve's return)
            release_serve(_HELD["lease"], err)


def _serve_holding(flow, config, store, cron, timezone, allow, configs_dir, limits, lease, err) -> None:
    data = read_yaml(config)  # parsed once: validated as given, then within the operator's limits
    # a bad recipe is refused here (exit 2), not at 2 am
    recipe = load_recipe(config, {"store": store} if store else {}, data=data)
    check_schedule(cron, timezone)
    name = operator_environment(config, recipe.store, list(allow or []), configs_dir, limits)

    # the served recipe itself keeps inside the limits
    load_recipe(config, {"store": recipe.store, **operator_limits()}, data=data)
    if allow:
        err.print(f"UI runs may also set: {', '.join(allow)}", markup=False, highlight=False)
    paused = nightly_paused_by_a_person()
    if paused:
        err.print(
            f"{FLOW}/{NIGHTLY} was paused on the server and stays paused: resume its schedule in the UI "
            f"or with `prefect deployment schedule resume {FLOW}/{NIGHTLY} SCHEDULE_ID`",
            markup=False,
            highlight=False,
        )

    try:
        asyncio.run(_serve(flow, deployment_options(name, cron=cron, timezone=timezone, nightly_paused=paused), lease))
    except (KeyboardInterrupt, TerminationSignal, asyncio.CancelledError):  # Ctrl-C; SIGTERM (`_serve` cancels itself)
        pass
    except SystemExit as exc:  # Prefect's runner exits on a SIGTERM that comes while it is starting
        if exc.code not in (0, None):
            raise
    err.print(
        f"serve stopped. The schedule of {FLOW}/{NIGHTLY} is left as it is"
        + (
            ""
            if paused
            else ": runs due while nothing serves them show as Late and start when `regimen serve` runs again"
        )
        + f". To stop nightly runs, pause the schedule in the UI or with `prefect deployment schedule pause "
        f"{FLOW}/{NIGHTLY} SCHEDULE_ID` (`prefect deployment schedule ls` shows the id).",
        markup=False,
        highlight=False,
    )


async def _guard_records(flow, deployment_ids) -> None:
    """Set each registered deployment's guarded fields to what serve means (no path, pull steps or storage,
    the closed parameter schema) and put their digests in this process's environment, which runs inherit."""
    schema = closed_parameter_schema(flow)
    digests = {}
    async with get_client() as client:
        for deployment_id in deployment_ids:
            await client.update_deployment(
                deployment_id,
                DeploymentUpdate(
                    parameter_openapi_schema=schema,
                    path=None,
                    pull_steps=[],
                    job_variables={},
                    storage_document_id=None,
                    infrastructure_document_id=None,
                    entrypoint=entrypoint(flow),
                ),
            )
            digests[str(deployment_id)] = record_digest(await client.read_deployment(deployment_id))
    os.environ["REGIMEN_DEPLOYMENTS"] = json.dumps({k: v[0] for k, v in digests.items()})
    os.environ["REGIMEN_DEPLOYMENT_FIELDS"] = json.dumps({k: v[1] for k, v in digests.items()})


async def _serve(flow, options: dict[str, dict[str, Any]], lease: Any = None) -> None:
    """Prefect's `serve`, built from its public parts so that each flow run executes this process's own
    flow object: `Runner.add_flow` registers the flow itself, and its runs start as
    `run_flow_in_subprocess(flow, ...)`, which never reads a deployment's entrypoint, path or pull steps
    from the server (`Runner.add_deployment`, what `serve()` uses, re-resolves them at every run, also in
    this process on a crash or a cancel). One run at a time (`limit=1`); stopping leaves the schedules as
    they are (`pause_on_shutdown=False`).

    At registration the guarded fields are set to what serve means (a tampered `path` or pull steps are
    reset, the parameter schema is closed) and their digests go to this process's environment, which
    each run inherits: a run of a deployment whose record has changed since is refused
    (`check_deployment`). When the Prefect API goes away, the runner stops; serve waits for the API to
    answer again, registers anew and goes on serving (runs that were due show as Late meanwhile)."""
    # imported now: a SIGTERM in the middle of an import (FastAPI's models, which the runner imports as it
    # starts) comes out as a pydantic SchemaError, not as a stop

    log = logging.getLogger("regimen.serve")
    # a SIGTERM cancels this loop at its next await, a clean stop (not an exception raised in whatever code is
    # running); once started, Prefect's runner installs its own handler, which stops it gracefully
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, asyncio.current_task().cancel)
    if lease is not None:  # serve's claim (`claim_serve`), renewed while this loop serves
        _renewing = asyncio.ensure_future(keep_serve_claim(lease))  # cancelled with the loop at the end of asyncio.run
    while True:
        runner = Runner(name="regimen", limit=1, pause_on_shutdown=False)
        try:
            ids = {name: await runner.aadd_flow(flow, name=name, **kw) for name, kw in options.items()}
            await _guard_records(flow, ids.values())
            # only now is the record what serve means: a change made through the API before this line is
            # overwritten by the registration, one made after it refuses the runs (`check_deployment`)
            print(
                f"serving {', '.join(f'{FLOW}/{name}' for name in ids)}: registered, runs start here",
                file=sys.stderr,
                flush=True,
            )
            await runner.start()
            return
        except Exception as exc:  # noqa: BLE001 - the API went away (a refused connection, the runner's "Service exceeded error threshold"); else re-raised
            # also a failure of another kind while the API is gone
            if not (_api_unreachable(exc) or not await _api_answers()):
                raise
            log.warning(
                "Prefect's API is unreachable (%s): serve waits for it to come back, then registers again",
                str(exc)[:200],
            )
            try:
                await runner.astop()
            except Exception:  # noqa: BLE001 - it is stopping because it failed
                pass
            while not await _api_answers():
                await asyncio.sleep(5)
            log.warning("Prefect's API answers again: serving")


def _api_unreachable(exc: BaseException) -> bool:
    """The API went away: a transport error, or the runner's loops giving up on it, also when anyio's task
    groups wrap them in exception groups (seen: "unhandled errors in a TaskGroup" around the threshold)."""
    import httpx
    from websockets.exceptions import WebSocketException

    if isinstance(exc, BaseExceptionGroup):
        return all(_api_unreachable(e) for e in exc.exceptions)
    lost = (httpx.TransportError, ConnectionError, WebSocketException)  # the events client speaks websockets
    # (seen in CI: the server killed while the runner starts its event emitter: "Runner failed to start:
    # event_emitter — did not receive a valid HTTP response", caused by websockets' InvalidMessage)
    return isinstance(exc, lost) or "error threshold" in str(exc) or isinstance(exc.__cause__, lost)


async def _api_answers() -> bool:
    try:
        async with get_client() as client:
            return (await client.api_healthcheck()) is None
    except Exception:  # noqa: BLE001 - any failure means: not yet
        return False


# -- serve is the one-host path (flows/serving/pool.py makes the several-hosts path) ------------------------------

SERVE_LIMIT = "regimen-serve"
SERVE_LEASE_S = 60.0  # the least Prefect's server takes (and the default); renewed every third of it
DEFAULT_POOL = "regimen"
WORKER_COMMAND = "prefect worker start --pool {pool} --limit 1"
_HELD: dict[str, Any] = {}  # serve's current lease (taken anew if the server lost it), released when serve stops


def pool_deployments() -> dict[str, str]:
    """`on-demand`/`nightly` of regimen-cycle as the server holds them, that belong to a work pool: name -> pool."""
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
        raise InputError(
            f"regimen-cycle/{', /'.join(sorted(found))} belong to the work pool {pool!r} (`regimen pool setup`): their "
            f"runs go to "
            f"that pool's workers (`{WORKER_COMMAND.format(pool=pool)}` on each host), so `regimen serve` is refused "
            f"here; to "
            "serve on one host instead, delete them first (`prefect deployment delete regimen-cycle/on-demand`, and "
            "/nightly)"
        )


def serve_lease_s() -> float:
    """Serve's lease: REGIMEN_SERVE_LEASE_S seconds (at least Prefect's least, 60) or 60. Longer: a serve
    that died keeps its place longer, and a busy machine's late renewal never loses it."""
    raw = os.environ.get("REGIMEN_SERVE_LEASE_S", "").strip()
    try:
        value = float(raw) if raw else SERVE_LEASE_S
    except ValueError:
        value = 0.0
    if not (math.isfinite(value) and value >= SERVE_LEASE_S):
        raise InputError(
            f"REGIMEN_SERVE_LEASE_S={raw!r}: a number of seconds >= {SERVE_LEASE_S:.0f} (Prefect's least lease)"
        )
    return value


def claim_serve() -> UUID:
    """Take the one slot of the global concurrency limit `regimen-serve` with a lease of 60 s (`serve_lease_s`),
    or refuse.

    Why a concurrency lease: it is Prefect's own object for "one holder at a time", taken atomically by
    the server, so two serves starting in the same second cannot both get it. The holder renews it every
    20 s (`keep_serve_claim`) and releases it when it stops (Ctrl-C, SIGTERM): a serve restarted at once
    is not refused. A serve that died (SIGKILL, its machine gone) stops renewing; Prefect's repossessor
    frees the slot once the lease expires, within 75 s. A slot left taken with no lease behind it (a
    server restarted with its leases in memory) is told apart from a live serve by the deployments'
    `last_polled`, which a live serve's runner updates every PREFECT_RUNNER_POLL_FREQUENCY seconds, and by
    the limit's own `updated`, which changes when a slot is taken: a slot whose deployments nobody polled
    and that nobody took for `STALE_S` (2 minutes) is reset and taken; one taken moments ago by a serve
    still starting (its runner has not polled yet) is not. The deployments' `last_polled` alone would
    refuse a serve restarted right after a clean stop for a minute and more."""
    lease_s = serve_lease_s()  # a bad REGIMEN_SERVE_LEASE_S is refused before anything reaches the server
    with get_client(sync_client=True) as client:
        client.upsert_global_concurrency_limit_by_name(SERVE_LIMIT, 1)
        changed = client.read_global_concurrency_limit_by_name(
            SERVE_LIMIT
        ).updated  # before our own try (a refused one counts too)
    for attempt in (1, 2):
        lease = asyncio.run(take_serve_slot())
        if lease is not None:
            _HELD["lease"] = lease
            return lease
        if attempt == 1 and not served_lately() and not lately(changed):
            _reset_stale_slot()
            continue
        raise InputError(
            "another `regimen serve` is serving regimen-cycle/on-demand and /nightly from this Prefect server (it "
            "holds the "
            f"concurrency limit {SERVE_LIMIT!r}): one host serves; for several hosts use a work pool: `regimen pool "
            f"setup "
            f"--store s3://bucket/prefix`, then `{WORKER_COMMAND.format(pool=DEFAULT_POOL)}` on each host (a serve "
            f"that died frees it within {lease_s + 15:.0f} s)"
        )
    raise AssertionError("unreachable")  # pragma: no cover


async def take_serve_slot() -> UUID | None:
    import httpx

    async with get_client() as client:
        try:
            response = await client.increment_concurrency_slots_with_lease(
                [SERVE_LIMIT], 1, "concurrency", serve_lease_s()
            )
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code == 423:  # Locked: the slot is taken
                return None
            raise
    return UUID(response.json()["lease_id"])


STALE_S = 120.0  # a serve slot nobody took and whose deployments nobody polled for this long is left over


def lately(when: Any) -> bool:
    """`when` (a server timestamp) is less than STALE_S ago."""
    return when is not None and (datetime.now(UTC) - when).total_seconds() < STALE_S


def served_lately() -> bool:
    """A runner polled `on-demand` or `nightly` less than STALE_S ago."""
    with get_client(sync_client=True) as client:
        for name in (ON_DEMAND, NIGHTLY):
            try:
                d = client.read_deployment_by_name(f"{FLOW}/{name}")
            except ObjectNotFound:
                continue
            if lately(d.last_polled):
                return True
    return False


def _reset_stale_slot() -> None:
    with get_client(sync_client=True) as client:
        client.update_global_concurrency_limit(SERVE_LIMIT, GlobalConcurrencyLimitUpdate(active_slots=0))


async def keep_serve_claim(lease: UUID, period_s: float | None = None) -> None:
    """Renew serve's lease (every third of it) until cancelled; a lease the server no longer knows (it
    restarted) is taken anew."""
    log = logging.getLogger("regimen.serve")
    period_s = period_s or serve_lease_s() / 3
    while True:
        await asyncio.sleep(period_s)
        try:
            async with get_client() as client:
                await client.renew_concurrency_lease(lease, serve_lease_s())
        except Exception as exc:  # noqa: BLE001 - the API is down (serve waits for it) or the lease is gone
            if getattr(getattr(exc, "response", None), "status_code", None) == 404:
                # the server lost its leases (restarted; they live in its memory) but not the slot they held,
                # which is this serve's own: free it and take it again, so a later serve is not refused
                lease = await _retake() or lease
                _HELD["lease"] = lease
            else:
                log.debug("renewing serve's lease failed: %s", exc)


async def _retake() -> UUID | None:
    lease = await take_serve_slot()
    if lease is None:
        async with get_client() as client:
            await client.update_global_concurrency_limit(SERVE_LIMIT, GlobalConcurrencyLimitUpdate(active_slots=0))
        lease = await take_serve_slot()
    return lease


def release_serve(lease: UUID, err: Any = None) -> None:
    """Give serve's slot back (three tries a second apart); where the server does not answer, say that the
    slot stays taken until its lease expires."""
    lease = _HELD.pop("lease", lease)
    for attempt in range(3):
        try:  # a lease the server no longer knows (it restarted) is answered 204 too: nothing of ours is left
            with get_client(sync_client=True) as client:
                client.release_concurrency_slots_with_lease(lease)
            return
        except Exception as exc:  # noqa: BLE001 - the server is busy or gone: try again, then let the lease expire
            last = exc
            time.sleep(1.0 if attempt < 2 else 0.0)
    if err is not None:
        err.print(
            f"warning: serve's slot ({SERVE_LIMIT!r}) was not given back ({type(last).__name__}): the next `regimen "
            f"serve` is refused until its lease expires, within {serve_lease_s() + 15:.0f} s",
            markup=False,
            highlight=False,
        )


def serve_limit_exists() -> bool:
    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(SERVE_LIMIT)
            return True
        except ObjectNotFound:
            return False
