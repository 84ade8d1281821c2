"""The embedded default's serverless Celery broker: kombu's filesystem transport, with
atomic message files.

kombu's ``_put`` creates the ``.msg`` file and only then writes it, so a consumer polling the
folder can read it empty and crash (kombu#1551). Here a message is written to a hidden
``.part`` file and renamed into place, so a reader sees either nothing or the whole message.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

from kombu.transport import filesystem
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    def _put(self, queue: str, message: Any, **kwargs: Any) -> None:  # type: ignore[override]
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        # The leading dot keeps the partial file out of every queue's listing.
        partial = os.path.join(self.data_folder_out, f".{name}.part")
        with open(partial, "wb") as handle:
            handle.write(dumps(message).encode())
        os.replace(partial, final)


class Transport(filesystem.Transport):
    Channel = Channel
