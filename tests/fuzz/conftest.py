"""Prints how many fuzz cases ran and what share compiled, after the tests."""

from .tally import summary


def pytest_terminal_summary(terminalreporter):
    lines = summary()
    if lines:
        terminalreporter.section("spec fuzzing")
        for line in lines:
            terminalreporter.write_line(line)
