"""The ``ppl`` command line: fit, compare, show, predict, calibrate, datasets, methods.

Bad input or usage exits with status 2 and writes nothing. Each command lives in its own module
(``ppl.cli.fit``, ``ppl.cli.compare``, …), imported only when that command runs: ``ppl --help``,
``ppl datasets`` and ``ppl methods`` never load JAX. Within a command module every import is at
module level.
"""

from __future__ import annotations

import importlib
import os
import sys

from ppl.cli._arguments import UsageError, build_parser, parse_arguments, require_model_and_data
from ppl.core import interrupt
from ppl.core.cache import use_compilation_cache
from ppl.core.errors import DataError, MemoryBudgetError, NonFiniteError, OptionError, ResumeError, RunError

# command -> (module of ppl.cli, its function taking the parsed arguments)
COMMANDS = {
    "fit": ("fit", "run"), "compare": ("compare", "run"), "show": ("show", "run"), "predict": ("predict", "run"),
    "calibrate": ("calibrate", "run"), "datasets": ("listings", "datasets"), "methods": ("listings", "methods"),
}

__all__ = ["main"]


def main(argv=None) -> int:
    name = "ppl"  # "ppl fit", "ppl show", … once the arguments are parsed
    # Ctrl-C and SIGTERM (a scheduler, `timeout`, a container stop) are the command's from its first
    # moment to its last: each is remembered until acted on, and ends the command with 128 + its number.
    with interrupt.command():
        try:
            args = parse_arguments(build_parser(), argv)
            name = f"ppl {args.command}"
            if args.command == "fit" and not args.resume:
                require_model_and_data(args)  # before the command's module loads JAX: answered at once
            if not getattr(args, "no_cache", True):
                use_compilation_cache()
            module, function = COMMANDS[args.command]
            # the command's module (and with it JAX, for the commands that fit or load) loads only now
            code = getattr(importlib.import_module(f"ppl.cli.{module}"), function)(args)
            if code == 0 and interrupt.pending():
                # The signal came as the command finished, or its KeyboardInterrupt was dropped where
                # nothing read the request: the output is complete, but a caller must still see the stop.
                print(f"{name}: interrupted as it finished; what it printed and saved is complete",
                      file=sys.stderr)
                return interrupt.exit_status()
            return code
        except (UsageError, DataError, OptionError, MemoryBudgetError, RunError, ResumeError) as error:
            print(f"{name}: error: {error}", file=sys.stderr)
            return 2
        except NonFiniteError as error:
            print(f"{name}: training failed: {error}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print(f"{name}: interrupted before there was anything to save", file=sys.stderr)
            return interrupt.exit_status()
        except BrokenPipeError:
            # the reader went away (`ppl methods | head`): stop quietly, as other command-line tools do
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
