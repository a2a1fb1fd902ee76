"""The package version, in a module of its own: provenance records, the downloader's user agent and
packed-file headers read it without importing the package's public API (which imports them)."""

__version__ = "0.1.0"
