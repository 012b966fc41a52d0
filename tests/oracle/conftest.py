"""The differential suites print their counts at the end of the pytest run."""
from __future__ import annotations

ORACLE_COUNTS: list[str] = []


def pytest_terminal_summary(terminalreporter) -> None:
    if ORACLE_COUNTS:
        terminalreporter.section("kvscope vs vLLM 0.32")
        for line in ORACLE_COUNTS:
            terminalreporter.write_line(line)
