"""The loader's user-facing error, in a module of its own so that `loading` and `bundled`
(and `compat`) can all raise it without importing each other."""


class LoadError(Exception):
    """A model family could not be loaded; `str(err)` is a message meant for users."""
