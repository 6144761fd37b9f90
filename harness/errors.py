"""Errors a user can cause; the CLI prints them as one line and exits non-zero."""


class CbbenchError(Exception):
    """Bad flag, unreadable result folder, unreachable server: says what and where."""


RESOURCE_ERRNOS = (23, 24)  # ENFILE, EMFILE: the system's or the process's open files


def resource_hint(exc: BaseException) -> str:
    """What to do about an OS resource error (too many open files), or ''."""
    errno = getattr(exc, "errno", None) or getattr(exc.__cause__, "errno", None)
    if "ulimit -n" in str(exc):  # said already
        return ""
    if errno not in RESOURCE_ERRNOS and "too many open files" not in str(exc).lower():
        return ""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        limit = f" (ulimit -n is {soft})"
    except (ImportError, OSError, ValueError):
        limit = ""
    return f": out of file descriptors{limit}; lower --concurrency or raise ulimit -n"
