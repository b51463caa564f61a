"""Every command's own ``--help`` explains it: what it does and waits for, each flag and argument,
and examples that are commands the parser takes as they are written."""

from __future__ import annotations

import argparse
import shlex

import pytest

from peering.cli.main import build_parser

Command = tuple[tuple[str, ...], argparse.ArgumentParser]


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[Command]:
    """The commands one runs (``tenant limit``, ``install``), not the groups (``tenant``)."""
    groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    found = [] if groups and all(g.required for g in groups) else [(path, parser)]
    for group in groups:
        for name, sub in group.choices.items():
            found += _commands(sub, (*path, name))
    return found


COMMANDS = _commands(build_parser())


def test_gpuferry_help_walks_a_user_through_the_whole_story(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    assert parser.epilog
    examples = [line.strip() for line in parser.epilog.splitlines()[1:]]
    commands = [" ".join(shlex.split(e)[1:3]) for e in examples]
    assert [c.split()[0] for c in commands] == [
        "install",
        "install",
        "peer",
        "offload",
        "info",
        "unoffload",
        "unpeer",
    ]
    for example in examples:
        parser.parse_args(shlex.split(example)[1:])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    assert "`gpuferry COMMAND --help`" in capsys.readouterr().out


def test_the_commands_are_all_found() -> None:
    names = {" ".join(path) for path, _ in COMMANDS}
    assert {"peer", "unpeer", "info", "offload namespace", "unoffload namespace", "install crds",
            "uninstall", "tenant limit", "agents", "network status", "version"} <= names  # fmt: skip


@pytest.mark.parametrize(("path", "parser"), COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_each_command_says_what_it_does_and_every_flag_what_it_means(
    path: tuple[str, ...], parser: argparse.ArgumentParser
) -> None:
    assert parser.description and len(parser.description.split()) >= 15, f"{' '.join(path)}: no description"
    unexplained = [
        "/".join(a.option_strings) or a.dest
        for a in parser._actions
        if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)
        and not (a.help and a.help.strip())
    ]
    assert unexplained == [], f"{' '.join(path)}: flags without help"


@pytest.mark.parametrize(("path", "parser"), COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_each_commands_examples_are_commands_it_takes(
    path: tuple[str, ...], parser: argparse.ArgumentParser, capsys: pytest.CaptureFixture[str]
) -> None:
    assert parser.epilog and parser.epilog.startswith("examples:\n"), f"{' '.join(path)}: no examples"
    examples = [line.strip() for line in parser.epilog.splitlines()[1:]]
    assert examples
    for example in examples:
        argv = shlex.split(example.split("|")[0])
        assert argv[0] == "gpuferry", example
        try:
            build_parser().parse_args(argv[1:])
        except SystemExit:
            pytest.fail(f"{example!r} is not taken: {capsys.readouterr().err}")
    # and --help prints them as written, one per line
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([*path, "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert all(f"  {e}\n" in out for e in examples)
