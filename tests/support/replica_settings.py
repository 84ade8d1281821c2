"""Settings of a web replica a test starts as its own process: the test settings, with the live
streams' polls a minute away, so only a wake-up from PostgreSQL ``LISTEN/NOTIFY`` can bring a
change to a stream within a test's patience."""

from tests.settings import *  # noqa: F403

LOOPWRIGHT_UI = {
    "SSE_POLL_SECONDS": 60.0,
    "SSE_SAFETY_POLL_SECONDS": 60.0,
    "SSE_HEARTBEAT_SECONDS": 1.0,
    "SSE_MAX_SECONDS": 60.0,
    "SSE_RETRY_MS": 500,
}
