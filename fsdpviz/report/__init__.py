"""One pipeline result -> one standalone offline HTML page.

Layout: ``build`` (the entry point, :func:`build_report`), ``data`` (everything the page shows, as
tables: :func:`prepare_report`), one package or module per page section with its data, words and
plots together (``headline``, ``timeline``, ``units``, ``steps``), ``page`` (the sections in order),
``html`` (the page model and its rendering), ``charts`` and ``style`` (shared by the sections), and
``compare`` (the compare page). Importing this package stays light: holoviews and bokeh load when a
page is built.
"""

from fsdpviz.report.build import LOOSE_REPORT_NAME, REPORT_NAME, ReportResult, build_report, default_output

__all__ = ["LOOSE_REPORT_NAME", "REPORT_NAME", "ReportResult", "build_report", "default_output"]
