"""`regimen serve` (one host: deployments served by this process) and `regimen pool setup` (several hosts: a
Prefect process work pool). The work is in `flows/serving/`; these parse, call it, and print."""

from __future__ import annotations

from typing import Annotated

import typer

from regimen.flows.cli.app import app, console


@app.command()
def serve(
    config: Annotated[str, typer.Argument(help="recipe in the configs folder the deployments run by default")],
    store: Annotated[str | None, typer.Option("--store", help="artifact store for runs of these deployments")] = None,
    cron: Annotated[str, typer.Option("--cron", help="schedule of the nightly deployment")] = "0 2 * * *",
    timezone: Annotated[str, typer.Option("--timezone", help="time zone of the cron schedule")] = "UTC",
    allow: Annotated[
        list[str] | None,
        typer.Option(
            "--allow",
            help="let UI runs also set this recipe key (a dotted key or pattern, e.g. model.name_or_path); repeatable",
        ),
    ] = None,
    configs: Annotated[
        str | None,
        typer.Option(
            "--configs",
            help="the folder UI runs choose recipes from (default: ./configs); it must hold the served recipe",
        ),
    ] = None,
    allow_unauthenticated_api: Annotated[
        bool,
        typer.Option(
            "--allow-unauthenticated-api",
            help="serve a Prefect API other machines can reach without authentication (behind your own proxy)",
        ),
    ] = False,
    max_steps: Annotated[
        int,
        typer.Option(
            "--max-steps", min=0, help="a served run's training stages train at most this many steps (0: no limit)"
        ),
    ] = 100_000,
    max_checkpoints: Annotated[
        int,
        typer.Option(
            "--max-checkpoints", min=0, help="checkpoints a training stage keeps at most (0: no limit; else at least 2)"
        ),
    ] = 5,
    max_hours: Annotated[
        float,
        typer.Option("--max-hours", min=0, help="wall time of a served run: training stops past it (0: no limit)"),
    ] = 24.0,
    max_disk_gb: Annotated[
        float,
        typer.Option(
            "--max-disk-gb",
            min=0,
            help="size of a served run's experiment folder: training stops past it (0: no limit)",
        ),
    ] = 50.0,
) -> None:
    """Register and serve the deployments `on-demand` and `nightly` of the flow regimen-cycle."""
    from regimen.flows.pipeline.cycle import regimen_cycle
    from regimen.flows.serving.deploy import serve_deployments

    serve_deployments(
        config,
        flow=regimen_cycle,
        store=store,
        cron=cron,
        timezone=timezone,
        allow=list(allow or []),
        configs_dir=configs,
        allow_unauthenticated=allow_unauthenticated_api,
        limits={
            "max_steps": max_steps,
            "max_checkpoints": max_checkpoints,
            "max_hours": max_hours,
            "max_disk_gb": max_disk_gb,
        },
    )


pool_app = typer.Typer(no_args_is_help=True, help="Several hosts: a Prefect process work pool, one worker per host.")
app.add_typer(pool_app, name="pool")


@pool_app.command("setup")
def pool_setup(
    store: Annotated[str, typer.Option("--store", help="the bucket every host shares, e.g. s3://bucket/prefix")],
    pool: Annotated[str, typer.Option("--pool", help="the process work pool's name")] = "regimen",
    config: Annotated[
        str, typer.Option("--config", help="recipe in the configs folder the deployments run by default")
    ] = "configs/default.yaml",
    configs: Annotated[
        str | None, typer.Option("--configs", help="the folder UI runs choose recipes from (default: ./configs)")
    ] = None,
    cron: Annotated[str, typer.Option("--cron", help="schedule of the nightly deployment")] = "0 2 * * *",
    timezone: Annotated[str, typer.Option("--timezone", help="time zone of the cron schedule")] = "UTC",
    allow: Annotated[
        list[str] | None,
        typer.Option("--allow", help="let UI runs also set this recipe key; repeatable (as serve --allow)"),
    ] = None,
    allow_unauthenticated_api: Annotated[
        bool,
        typer.Option("--allow-unauthenticated-api", help="a Prefect API other machines reach without authentication"),
    ] = False,
    max_steps: Annotated[int, typer.Option("--max-steps", min=0, help="as `regimen serve --max-steps`")] = 100_000,
    max_checkpoints: Annotated[
        int, typer.Option("--max-checkpoints", min=0, help="as `regimen serve --max-checkpoints`")
    ] = 5,
    max_hours: Annotated[float, typer.Option("--max-hours", min=0, help="as `regimen serve --max-hours`")] = 24.0,
    max_disk_gb: Annotated[float, typer.Option("--max-disk-gb", min=0, help="as `regimen serve --max-disk-gb`")] = 50.0,
    heartbeat_s: Annotated[
        int, typer.Option("--heartbeat-s", help="seconds between a run's heartbeats (Prefect's least: 30)")
    ] = 30,
    host_lost_after_s: Annotated[
        int | None,
        typer.Option(
            "--host-lost-after-s",
            help="no heartbeat this long: the run's host is lost and the run is scheduled again (default: the store "
            "lease's 120 s + a heartbeat)",
        ),
    ] = None,
) -> None:
    """Create (or update) a process work pool, deploy regimen-cycle/on-demand and /nightly to it, and the automations
    that redo a run whose host was lost."""
    from regimen.flows.pipeline.cycle import regimen_cycle
    from regimen.flows.serving.deploy import WORKER_COMMAND
    from regimen.flows.serving.pool import pool_setup as setup

    made = setup(
        store,
        flow=regimen_cycle,
        pool=pool,
        config=config,
        configs_dir=configs,
        cron=cron,
        timezone=timezone,
        allow=list(allow or []),
        allow_unauthenticated=allow_unauthenticated_api,
        heartbeat_s=heartbeat_s,
        host_lost_after_s=host_lost_after_s,
        limits={
            "max_steps": max_steps,
            "max_checkpoints": max_checkpoints,
            "max_hours": max_hours,
            "max_disk_gb": max_disk_gb,
        },
    )
    console.print(
        f"work pool {made['pool']!r}: regimen-cycle/on-demand and /nightly deployed (recipe {made['config']}, store "
        f"{store}); "
        f"a run without a heartbeat for {made['host_lost_after_s']} s is marked Crashed (HostLost) and scheduled again",
        markup=False,
        highlight=False,
    )
    console.print(
        f"on each host, in this project's folder, with the bucket's AWS_* environment: "
        f"{WORKER_COMMAND.format(pool=made['pool'])}",
        markup=False,
        highlight=False,
    )
