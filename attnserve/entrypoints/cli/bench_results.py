"""What every offline ``attnserve bench`` kind ends with: the results flags (``--output-json``, ``--plot``,
``--no-progress``), the early check that a plot can be drawn, and the table, JSON and plot written."""

from __future__ import annotations

import argparse

from attnserve.entrypoints.cli.arg_types import output_file
from attnserve.refusals import bench as words


def add_outputs(p: argparse.ArgumentParser, plot_help: str) -> None:
    g = p.add_argument_group("results")
    g.add_argument(
        "--output-json", type=output_file, default=None, metavar="FILE", help="write the full results as JSON"
    )
    g.add_argument("--plot", type=output_file, default=None, metavar="PNG", help=plot_help + " (needs matplotlib)")
    g.add_argument("--no-progress", dest="progress", action="store_false", help="no tqdm progress bars")


def check_plot(args: argparse.Namespace, parser) -> None:
    """Fail before the run, not after it, when --plot cannot be drawn."""
    import importlib.util

    if args.plot and importlib.util.find_spec("matplotlib") is None:
        parser.error(words.PLOT_NEEDS_MATPLOTLIB)


def finish(args: argparse.Namespace, result: dict, plot) -> int:
    """Print the table, write the JSON and the plot."""
    print(result["table"])
    if args.output_json:
        from attnserve.benchmarks.stats import write_json

        write_json(args.output_json, {k: v for k, v in result.items() if k != "table"})
    if args.plot:
        plot(result, args.plot)
    return 0
