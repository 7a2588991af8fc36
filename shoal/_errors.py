"""Exception hierarchy shared by every layer (leaf module: stdlib only)."""


class ShoalError(Exception):
    """Base class of every error shoal raises on purpose."""


class TopologyError(ShoalError, ValueError):
    """A bad topology description, e.g. a malformed ``SHOAL_TOPOLOGY`` value."""
