"""The fixtures the multi-host test modules share (testbed_helpers.py defines them)."""

from testbed_helpers import no_leftovers, pilot, testbed  # noqa: F401 - fixtures
