"""CSV and self-contained HTML reports."""
