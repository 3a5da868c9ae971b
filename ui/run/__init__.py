"""The run section: prompt, settings, the streaming output and its bars, the run's numbers."""
