"""Rendering: results (data) in, tables and text out. Reads only result records."""
