"""The loader's user-facing error, apart so that `loading`, `bundled` and `compat` raise it without a cycle."""


class LoadError(Exception):
    """A model family could not be loaded; `str(err)` is a message meant for users."""
