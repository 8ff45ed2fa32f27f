"""The `regimen` command's shell: the typer app, the options commands share, and `main`, which maps failures to
exit codes: 0 done, 1 a gate, a stage or the store stopped it, 2 bad input, 130 Ctrl-C (or a cancel), 143
SIGTERM. Prefect's own tracebacks of a failure stay in Prefect's logs; the terminal gets one line that says what
happened and what to do. The commands live beside it, one module per concern (`run`, `models`, `serving`,
`reward_check`), and register themselves on `app` when `regimen.flows.cli` is imported."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer
from rich.console import Console

from regimen.stages.core.errors import InputError, RegimenError

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
    help="Regimen: distillation-style SFT and GRPO in cycles, orchestrated by Prefect.",
)
# emoji=False: a name such as `my:fire:recipe.yaml` is printed as written, not as an emoji
console = Console(stderr=False, width=None if sys.stdout.isatty() else 160, emoji=False)
err = Console(stderr=True, soft_wrap=True, emoji=False)

SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="override a recipe field: KEY=VALUE with a dotted key, e.g. grpo.beta=0.05"),
]
StoreOpt = Annotated[str | None, typer.Option("--store", help="artifact store: a folder or an fsspec URL")]
ExperimentOpt = Annotated[str | None, typer.Option("--experiment", help="experiment name in the store")]


def main() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        code = app(standalone_mode=False)  # a command's `typer.Exit(n)` comes back as n without standalone mode
        if isinstance(code, int) and code:
            sys.exit(code)
    except InputError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False)
        sys.exit(2)
    except RegimenError as exc:
        stopped = "interrupted" if getattr(exc, "exit_code", 1) in (130, 143) else "stopped"
        err.print(f"{stopped}: {exc}", markup=False, highlight=False)
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        err.print(
            "interrupted (Ctrl-C): finished stages are kept; a rerun reuses them and resumes the interrupted one from "
            "its last checkpoint"
        )
        sys.exit(130)
    except OSError as exc:  # the machine, not the user: a full disk, a read-only folder
        from regimen.stages.store.files import describe_os_error

        err.print(
            f"stopped: {describe_os_error(exc, getattr(exc, 'filename', '') or '')}", markup=False, highlight=False
        )
        sys.exit(1)
    except BaseException as exc:
        if type(exc).__name__ == "TerminationSignal":  # prefect.exceptions.TerminationSignal: SIGTERM between stages
            err.print(
                "interrupted (SIGTERM): finished stages are kept; a rerun reuses them and resumes the interrupted one "
                "from its last checkpoint"
            )
            sys.exit(143)
        if isinstance(exc, (SystemExit, GeneratorExit)):
            raise
        if isinstance(exc, _click_exceptions()):
            sys.exit(_say_usage_error(exc))
        raise
    sys.exit(0)


def _click_exceptions() -> tuple[type, ...]:
    """The exception classes a command-line misuse raises: typer's own vendored click's (reached through its
    public `typer.BadParameter`, whose bases they are) and click's, for commands built on click itself."""
    import click

    vendored = [k for k in typer.BadParameter.__mro__ if k.__name__ == "ClickException"]
    return (click.exceptions.ClickException, *vendored)


def _say_usage_error(exc) -> int:
    """A misuse (a missing argument, an unknown option, a bad value) as one line naming the command, and
    exit 2; a bare command group (`regimen`, `regimen heldout`) shows its help."""
    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None else "regimen"
    if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
        console.print(ctx.get_help(), markup=False, highlight=False)
        return 2
    message = " ".join(exc.format_message().split())
    err.print(f"error: {command}: {message} (see `{command} --help`)", markup=False, highlight=False)
    return 2
