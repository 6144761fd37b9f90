"""The locustfile `cbbench locust` runs (`locust -f` this file). Your own locustfile can do
the same two imports, or subclass `CbbenchUser`."""

from cbbench.harness.locust import hooks  # noqa: F401 - registers the event listeners
from cbbench.harness.locust.user import CbbenchUser

__all__ = ["CbbenchUser"]
