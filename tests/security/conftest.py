"""Fixtures of the security tests: the Node client's (``node``: node with its pinned
node_modules), shared with tests/clients."""

from tests.clients.test_node_client import node  # noqa: F401
