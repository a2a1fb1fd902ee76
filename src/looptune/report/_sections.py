"""Report pieces every kind of results shares: provenance, decisions, key/value tables."""

from __future__ import annotations

from typing import Any

from looptune.report.document import Section, Table, Text

__all__ = ["decisions_table", "fmt", "key_values", "provenance_section"]

# the provenance fields worth a row, in reading order, with their names in the report
_PROVENANCE = [("date", "date (UTC)"), ("device", "device"), ("device_name", "device name"),
               ("cpu", "CPU"), ("cpu_count", "CPU cores"), ("torch_threads", "torch threads"),
               ("cuda", "CUDA"), ("platform", "platform"), ("python", "Python"),
               ("torch", "torch"), ("numpy", "numpy"), ("torchvision", "torchvision"),
               ("looptune", "looptune"), ("git_sha", "git SHA"),
               ("git_dirty", "uncommitted changes")]


def fmt(value: Any) -> str:
    """A number or value as a table cell: 4 significant digits for floats, n/a for None."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e6 else f"{value:,.0f}"
    return str(value)


def key_values(data: dict[str, Any], header: tuple[str, str] = ("what", "value")) -> Table:
    return Table(list(header), [[str(k), fmt(v)] for k, v in data.items()])


def provenance_section(provenance: dict[str, Any] | None) -> Section:
    """Where and with what the results were measured: hardware, versions, git SHA, date."""
    prov = provenance or {}
    if not prov:
        return Section("Provenance", [Text("These results carry no provenance record (written by "
                                           "an older looptune, or measured outside one).")])
    known = {k for k, _ in _PROVENANCE}
    rows = [[name, fmt(prov[key])] for key, name in _PROVENANCE if key in prov]
    rows += [[str(k), fmt(v)] for k, v in prov.items() if k not in known]
    return Section("Provenance", [Table(["", "value"], rows)])


def decisions_table(decisions: list[dict[str, Any]]) -> Table:
    """Every automatic choice with its value and reason."""
    return Table(["setting", "value", "reason"],
                 [[str(d.get("name")), repr(d.get("value")), str(d.get("reason", ""))]
                  for d in decisions])
