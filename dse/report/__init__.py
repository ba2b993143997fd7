"""Reports: plots, the self-contained HTML page and the files a study run writes."""
