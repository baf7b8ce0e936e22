"""The HTML page of a report (a Jinja2 template kept in Python so it ships with the package).

Self-contained: the plotly.js bundle is inlined in <head> once, no external fonts, styles or
scripts, so the file works offline from file://. Print CSS keeps each chart on one page, hides
plotly's toolbar, and the static tables carry the numbers when printed in black and white.
A <meta> before the bundle lists the CSVs the report wrote beside it, so that a rerun knows
which files it may replace; the generator <meta> (GENERATOR) marks the page as a report, so
that a report never replaces an HTML file it did not write.

The provenance block comes first: trace sets, GPU (measured or what-if), engine, acceptance
source and anchors, what the intervals are, and which rows are extrapolated (per method).
"""

from __future__ import annotations

GENERATOR = "vegas-sim report"

REPORT_TEMPLATE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="{{ generator }} {{ version }}">
<meta name="{{ companions_meta }}" content="{{ companions }}">
<title>{{ title }}</title>
<style>
  body { font-family: Helvetica, Arial, sans-serif; margin: 2rem auto; max-width: 1100px;
         color: #222; line-height: 1.4; padding: 0 1rem; }
  h1 { font-size: 1.6rem; margin-bottom: 0.2rem; }
  h2 { font-size: 1.2rem; margin-top: 2rem; border-bottom: 1px solid #ccc; }
  .meta { color: #555; font-size: 0.9rem; }
  .chart { margin: 1rem 0 2rem 0; }
  .plot { width: 100%; height: 420px; }
  .caption { color: #444; font-size: 0.9rem; margin: 0.3rem 0; }
  .note { color: #8a5a00; font-size: 0.9rem; }
  table.data { border-collapse: collapse; font-size: 0.85rem; margin: 0.5rem 0; }
  table.data th, table.data td { border: 1px solid #ccc; padding: 2px 6px; text-align: right; }
  table.data th { background: #f3f3f3; }
  ul.notes li { font-size: 0.9rem; }
  #provenance { border: 1px solid #ccc; background: #fafafa; padding: 0.5rem 1rem; }
  #provenance h2 { margin-top: 0.3rem; }
  #provenance th { text-align: left; padding-right: 1rem; font-weight: normal; color: #555; }
  .warning { color: #a00; font-weight: bold; }
  table.data { display: block; max-height: 28rem; overflow: auto; }
  @media print {
    body { margin: 0; max-width: none; font-size: 10pt; }
    .chart { break-inside: avoid; page-break-inside: avoid; }
    .modebar, .modebar-container { display: none !important; }
    .plot { height: 380px; }
    table.data { display: table; max-height: none; overflow: visible; }
    a { color: inherit; text-decoration: none; }
    a[href]::after { content: " (" attr(href) ")"; font-size: 0.8em; }
  }
</style>
<script type="text/javascript">{{ plotly_js }}</script>
</head>
<body>
<h1>{{ title }}</h1>
<p class="meta">{{ kind }} report · {{ n_rows }} rows · generated {{ generated }} by vegas-sim
{{ version }}{% if source %} · from <code>{{ source }}</code>{% endif %}</p>
<section id="provenance">
<h2>Provenance</h2>
{% for w in provenance.warnings %}<p class="warning">{{ w }}</p>{% endfor %}
<table class="provenance">
{% for label, value in provenance.items %}<tr><th>{{ label }}</th><td>{{ value }}</td></tr>
{% endfor %}</table>
{% if provenance.extrapolated %}<p class="note">Extrapolated (marked in every chart and table:
open markers, hatched bars, '*'):</p>
<ul class="notes">{% for e in provenance.extrapolated %}<li>{{ e }}</li>{% endfor %}</ul>{% endif %}
</section>
{% if notes %}<ul class="notes">{% for n in notes %}<li>{{ n }}</li>{% endfor %}</ul>{% endif %}
{% if csvs %}<p class="meta">Data beside this file:
{% for c in csvs %}<a href="{{ c }}">{{ c }}</a>{% if not loop.last %}, {% endif %}{% endfor %}</p>{% endif %}
{% for chart in charts %}
<section class="chart" id="{{ chart.id }}">
<h2>{{ chart.title }}</h2>
{% if chart.div %}{{ chart.div }}{% endif %}
{% if chart.caption %}<p class="caption">{{ chart.caption }}</p>{% endif %}
{% if chart.note %}<p class="note">{{ chart.note }}</p>{% endif %}
{% if chart.table %}{{ chart.table }}{% endif %}
</section>
{% endfor %}
</body>
</html>
"""
