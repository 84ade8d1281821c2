"""The agent runtime: the invocation contract, the model client and the tool loop with its tools.

Plain Python: it imports no Django, DRF, Celery or product app (``make lint`` keeps it so);
whatever it needs from a run reaches it through ``runtime.invocation``.
"""
