"""A-versus-B report for ``cosparse compare``: a self-contained HTML page with inline SVG charts."""

from cosparse.report.html import render_report, write_report

__all__ = ["render_report", "write_report"]
