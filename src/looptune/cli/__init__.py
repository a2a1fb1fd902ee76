"""The command line: thin; all logic lives in the library."""
