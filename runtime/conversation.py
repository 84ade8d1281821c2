"""The conversation an invocation drives: rebuilt from its journal (or a checkpoint), then
advanced step by step by ``runtime.loop``."""

from __future__ import annotations

from dataclasses import dataclass, field

from runtime.compaction import message_tokens
from runtime.dispatch import Phase
from runtime.history import CORRECTION_NOTICE
from runtime.repetition import RepetitionState
from runtime.types import Message


@dataclass
class Conversation:
    """The invocation's state, rebuilt from the journal and advanced step by step."""

    prompt: list[Message]
    budget_tokens: int
    history: list[Message] = field(default_factory=list)
    model_steps: int = 0
    repetition: RepetitionState = field(default_factory=RepetitionState)
    #: The next model step is the final, tool-less one.
    finalize: bool = False
    corrections: int = 0
    #: A correction of the last answer was asked for and is still to come.
    correcting: bool = False
    #: Running token estimate of the prompt and the first ``counted`` history messages, so a
    #: step adds its new messages instead of re-estimating the whole conversation.
    counted: int = 0
    counted_tokens: int = -1

    def tokens(self) -> int:
        """Compaction's estimate of prompt + history (messages are appended, never changed)."""
        if self.counted_tokens < 0:
            self.counted_tokens = sum(message_tokens(m) for m in self.prompt)
        for message in self.history[self.counted :]:
            self.counted_tokens += message_tokens(message)
        self.counted = len(self.history)
        return self.counted_tokens

    def add_notice(self, name: str, message: Message) -> None:
        """A message the loop added (a correction request opens a correction)."""
        self.history.append(message)
        if name == CORRECTION_NOTICE:
            self.corrections += 1
            self.correcting = True

    def add_model_message(self, message: Message) -> None:
        """A model step's assistant message (its tool results follow it)."""
        self.model_steps += 1
        self.correcting = False
        self.history.append(message)

    def next_phase(self, max_steps: int) -> Phase:
        if self.correcting:
            return Phase.CORRECTION
        if self.finalize or self.model_steps >= max_steps:
            return Phase.FINAL
        if self.model_steps == max_steps - 1:
            return Phase.LAST
        return Phase.NORMAL
