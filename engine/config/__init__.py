"""The configuration: the key schema (dataclasses) and composing, checking and printing configs."""
