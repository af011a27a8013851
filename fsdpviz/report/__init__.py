"""Analysis tables -> holoviews objects (``plots``) -> one standalone offline HTML page (``html``).

Entry point: :func:`build_report` (``fsdpviz report`` and the end of ``fsdpviz record`` call it).
Importing this package stays light: holoviews and bokeh load when a page is built.
"""

from fsdpviz.report.build import LOOSE_REPORT_NAME, REPORT_NAME, ReportResult, build_report, default_output

__all__ = ["LOOSE_REPORT_NAME", "REPORT_NAME", "ReportResult", "build_report", "default_output"]
