"""The package's version: pyproject.toml reads it from here, the snapshot and the report show it."""

VERSION = "0.1.0"
