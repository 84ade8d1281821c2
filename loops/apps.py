from __future__ import annotations

from django.apps import AppConfig


class LoopsConfig(AppConfig):
    name = "loops"
    verbose_name = "Agent loops"

    def ready(self) -> None:
        from harness.checks import publish_check_register
        from instructions.usage import register as instruction_usage_register
        from loops.instruction_usage import pattern_instruction_uses
        from loops.metrics import engine_state_collect
        from loops.services.artifacts import artifact_store_tool_file
        from loops.services.patterns import profile_publish_check
        from loops.services.runs import run_is_canceled
        from orchestrator.metrics import state_collector_register
        from runtime.run_artifacts import run_artifact_store_register
        from runtime.run_cancellation import run_canceled_probe_register

        # A profile publish that would make a pattern following its tag break the registration
        # check (autonomy and human gates, worktree and repository) is refused.
        publish_check_register(profile_publish_check)
        # A tool whose call is cancelled asks whether the run was cancelled (then it stops its
        # remote work) or only paused or moved to another worker (then the call resumes).
        run_canceled_probe_register(run_is_canceled)
        # Files a tool brings back (a remote agent's file parts) are kept as run artifacts.
        run_artifact_store_register(artifact_store_tool_file)
        # Runs by live status, the queue and pending approvals, read at each scrape.
        state_collector_register("loops", engine_state_collect)
        # Where-used of an instruction: patterns whose goal template references it.
        instruction_usage_register(pattern_instruction_uses)
