"""AI employees and the model endpoints they call (the configuration side of the runtime)."""
