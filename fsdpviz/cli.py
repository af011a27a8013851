"""The ``fsdpviz`` command line: a typer app whose commands are thin glue.

Each command lives in ``fsdpviz/commands/<name>.py`` and only connects options to the layers
below (``record``; ``trace -> structure -> analysis -> replay -> whatif -> report``); heavy imports (pandas, holoviews, torch)
happen inside the command functions so ``fsdpviz --help`` stays fast.

Errors: a :class:`fsdpviz.errors.FsdpvizError` or a usage error becomes one line on stderr
(``error: ...``) and exit code 2, never a traceback.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any, NoReturn

import typer

# typer vendors click; its exception base is only reachable through the private module.
from typer._click.exceptions import ClickException as _ClickException
from typer._click.exceptions import NoArgsIsHelpError as _NoArgsIsHelpError
from typer.core import TyperArgument

from fsdpviz import __version__
from fsdpviz.errors import EXIT_BAD_INPUT, FsdpvizError

app = typer.Typer(
    name="fsdpviz",
    help="See, per FSDP unit, whether parameter all-gathers hide behind compute.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain help: rich's panels squeeze each description into a narrow column at 80 columns and read
    # brackets in help texts as markup; click's formatter wraps to the terminal and prints text as is.
    rich_markup_mode=None,
    epilog=("Example:\n\n\b\n  fsdpviz record -o runs/base -- torchrun --nproc_per_node 8 train.py\n"
            "  fsdpviz summary runs/base\n  fsdpviz report runs/base\n\n"
            "Each command's --help shows its options and an example."),
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"fsdpviz {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """fsdpviz: record FSDP / ZeRO-3 training runs and see their communication overlap per unit."""
    from fsdpviz.commands.common import own_this_process

    own_this_process()


def _register_commands() -> None:
    if app.registered_commands:  # main() may run many times in one process (tests, embedding)
        return
    # One line per command; each command module imports heavy packages lazily inside its function.
    # (Commands are added here as their modules land: summary, record, report, compare, export, whatif.)
    from fsdpviz.commands.summary import EXAMPLE as SUMMARY_EXAMPLE
    from fsdpviz.commands.summary import summary

    app.command("summary", epilog=example(SUMMARY_EXAMPLE))(summary)
    from fsdpviz.commands.record import CONTEXT_SETTINGS as _RECORD_CONTEXT
    from fsdpviz.commands.record import EXAMPLE as RECORD_EXAMPLE
    from fsdpviz.commands.record import record

    app.command("record", context_settings=_RECORD_CONTEXT, epilog=example(RECORD_EXAMPLE))(record)
    from fsdpviz.commands.report import EXAMPLE as REPORT_EXAMPLE
    from fsdpviz.commands.report import report

    app.command("report", epilog=example(REPORT_EXAMPLE))(report)
    from fsdpviz.commands.export import EXAMPLE as EXPORT_EXAMPLE
    from fsdpviz.commands.export import export

    app.command("export", epilog=example(EXPORT_EXAMPLE))(export)
    from fsdpviz.commands.compare import EXAMPLE as COMPARE_EXAMPLE
    from fsdpviz.commands.compare import compare

    app.command("compare", epilog=example(COMPARE_EXAMPLE))(compare)
    from fsdpviz.commands.whatif import EXAMPLE as WHATIF_EXAMPLE
    from fsdpviz.commands.whatif import whatif

    app.command("whatif", epilog=example(WHATIF_EXAMPLE))(whatif)


def example(lines: str) -> str:
    """A command's help epilog: its example, kept line by line (click's ``\\b`` stops the rewrap)."""
    return "Example:\n\n\b\n" + "\n".join(f"  {line}" for line in lines.strip().splitlines())


def plain_arguments(command: Any) -> None:
    """Show each positional argument of ``command`` and its subcommands by its metavar (``RUN``,
    ``PATH...``) in the usage line and the help, without typer's type label (``<list[Path]>``) or
    its braces (``{run}``)."""
    for sub in getattr(command, "commands", {}).values():
        plain_arguments(sub)
    for param in command.params:
        if not isinstance(param, TyperArgument) or not param.metavar:
            continue
        name: str = param.metavar
        usage = name if param.required else f"[{name}]"
        # typer has no setting for either; the instance attributes stand in for its methods
        param.display_type_rich = _constant(None)  # type: ignore[method-assign]
        param._rich_display_name = _constant(name)  # type: ignore[method-assign]
        param._usage_display_name = _constant(usage)  # type: ignore[method-assign]


def _constant(value: str | None) -> Any:
    """A function of any arguments that answers ``value``."""
    def answer(*args: object, **kwargs: object) -> str | None:
        return value

    return answer


def error_line(message: str) -> None:
    """Print one ``error:`` line on stderr (the whole user-facing error contract)."""
    text = " ".join(str(message).split())  # one line, whatever the message contained
    print(f"error: {text}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``fsdpviz`` console script."""
    # Arrow's own allocator keeps what pandas' text columns freed; the system one hands it back with
    # the rest (structure.packed.release_freed_memory), which lowers the peak of a large run's parent.
    # Read when pyarrow is first imported, so set before; a user's own setting wins, and a command
    # `fsdpviz record` runs does not inherit fsdpviz's (record/environment.py).
    from fsdpviz.record.environment import set_own_default

    set_own_default("ARROW_DEFAULT_MEMORY_POOL", "system")
    _register_commands()
    command = typer.main.get_command(app)
    plain_arguments(command)
    try:
        rv = command.main(args=list(argv) if argv is not None else None, prog_name="fsdpviz",
                          standalone_mode=False)
    except FsdpvizError as exc:
        error_line(str(exc))
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        error_line("aborted")
        sys.exit(130)
    except _NoArgsIsHelpError as exc:
        exc.show()
        sys.exit(EXIT_BAD_INPUT)
    except _ClickException as exc:
        error_line(exc.format_message())
        sys.exit(EXIT_BAD_INPUT)
    except KeyboardInterrupt:
        error_line("interrupted")
        sys.exit(130)
    sys.exit(rv if isinstance(rv, int) else 0)


def run() -> NoReturn:
    """The ``fsdpviz`` console script and ``python -m fsdpviz``: :func:`main`, then a quick exit.

    Tearing down an interpreter that holds pandas, pyarrow and a run's tables takes ~0.08 s after the
    answer is out (a sixth of a small trace's summary). Every file a command writes is closed by then,
    so the exit handlers run, the standard streams are flushed and the teardown is skipped. With
    other threads still running, the exit is the usual one (they are waited for).
    """
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    if threading.active_count() > 1:
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that went away (`| head`), or a closed stream
            pass
    os._exit(code)


def _exit_code(code: object) -> int:
    """What the interpreter would exit with for ``sys.exit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1
