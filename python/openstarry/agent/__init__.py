"""The agent layer: interfaces, session memory, slash commands and the execution loop."""
